"""What tools/gpu_evaluator_parts.py takes to the GPU machine for OpenCompass's environment."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools.gpu_evaluator_parts import (
    INSTALL,
    LOCK,
    NOT_IMPORTED,
    TRL_LIST,
    VLLM_LIST,
    opencompass_side,
    pinned,
)


def test_opencompass_environment_is_the_locks_at_its_versions_without_torch_cuda_or_unimported() -> None:
    lock = pinned(LOCK.read_text(encoding="utf-8"))
    side = opencompass_side(LOCK.read_text(encoding="utf-8"))
    assert side["opencompass"] == lock["opencompass"] == "0.5.2"
    assert side["numpy"].startswith("1.") and side["transformers"].startswith("4.")
    # The worker runs there too: its own dependencies come along.
    assert {"pydantic-settings", "sqlalchemy", "rq", "redis"} <= set(side)
    assert all(side[name] == lock[name] for name in side)
    assert not {"torch", "triton", *NOT_IMPORTED} & set(side)
    assert not [name for name in side if name.startswith("nvidia-")]
    # Every exclusion names a package the lock holds (a stale name would hide nothing).
    assert set(NOT_IMPORTED) <= set(lock)


def test_the_engine_and_trl_lists_are_read_as_pins() -> None:
    engine = pinned(VLLM_LIST.read_text(encoding="utf-8"))
    trl = pinned(TRL_LIST.read_text(encoding="utf-8"))
    assert trl["trl"] == "1.16.0" and "datasets" in trl
    assert engine["vllm"] == "0.25.0" and "fastapi" in engine
    # One version of each package: the two lists installed into one folder must not disagree.
    assert all(engine[name] == trl[name] for name in set(engine) & set(trl))


def test_the_install_script_is_valid_bash_and_installs_both_environments(tmp_path: Path) -> None:
    script = tmp_path / "install.sh"
    script.write_text(INSTALL, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    assert "--target /root/site" in INSTALL and "--system-site-packages" in INSTALL
    assert "/root/vllm-python" in INSTALL


def test_a_benchmark_gets_only_the_parts_it_imports() -> None:
    from bench.run_all import GPU_BENCHMARKS
    from tools.gpu_evaluator_parts import BENCHMARK_PARTS, PARTS, selected_parts

    assert selected_parts("resident_engine_gpu", None) == ("vllm",)
    assert selected_parts("grpo_trl_vllm_gpu", None) == ("vllm", "trl")
    assert selected_parts("opencompass_worker_gpu", None) == ("oc", "vllm")
    assert selected_parts(None, None) == PARTS
    assert selected_parts(None, ["trl", "oc"]) == ("oc", "trl")
    # Every benchmark named is one of the GPU benchmarks `make bench` prints.
    assert set(BENCHMARK_PARTS) <= set(GPU_BENCHMARKS)
    # The install script installs each part only where its folder came along.
    for part in ("oc", "vllm"):
        assert f'if [ -d "$HERE/{part}" ]; then' in INSTALL
