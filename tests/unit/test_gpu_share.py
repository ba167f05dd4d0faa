"""A local evaluator that shares GPUs with a training agent waits for its share of GPU memory.

No GPU exists here: a stand-in `nvidia-smi` on PATH prints what the real one prints for
`--query-gpu=index,memory.free,memory.total --format=csv,noheader,nounits`, read from a file the
test rewrites."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl_evaluator import local_worker
from autorl_evaluator.local_worker import LocalWorker, gpu_free_fractions
from autorl_evaluator.settings import WorkerSettings


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    readings = tmp_path / "readings.csv"
    readings.write_text("0, 8000, 80000\n1, 60000, 80000\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat {readings}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(local_worker, "GPU_POLL_INTERVAL_S", 0.05)
    return readings


def test_free_fractions_follow_the_visible_devices(gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_free_fractions() == pytest.approx([0.1, 0.75])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_free_fractions() == pytest.approx([0.75])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_free_fractions() == []


def test_no_nvidia_smi_means_no_gpu_and_no_wait(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_free_fractions() == []


def test_an_evaluation_waits_until_every_gpu_has_its_share(
    gpus: Path, make_settings: Callable[..., WorkerSettings]
) -> None:
    worker = LocalWorker(make_settings(eval_gpu_min_free_fraction=0.5))
    done = threading.Event()
    thread = threading.Thread(target=lambda: (worker.wait_for_gpu_share(), done.set()), daemon=True)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set(), "GPU 0 has 10 % free: the evaluation must wait"
    gpus.write_text("0, 50000, 80000\n1, 60000, 80000\n")  # the agent released memory
    assert done.wait(timeout=10)


def test_without_the_setting_an_evaluation_starts_at_once(
    gpus: Path, make_settings: Callable[..., WorkerSettings]
) -> None:
    started = time.monotonic()
    LocalWorker(make_settings()).wait_for_gpu_share()
    assert time.monotonic() - started < 1
