"""The example agent's training phases (SFT, the fast GRPO path, TRL's GRPO) start no step that
would end past their stop time: a step takes 10 s of the phase's clock and the stop is 15 s away,
so the phase stops after one step and submits what it has, instead of starting a second step and
eating the reserve kept for saving and submitting."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autorl.tasks import get_task
from autorl_agents import example_grpo, fast_grpo, sft
from autorl_agents.example_config import ExampleGRPOConfig, GRPOSizes
from autorl_agents.step_clock import StepClock

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data"
STEP_S = 10.0
STOP_AFTER_S = 15.0


class _Agent:
    """The example agent's parts that its phases use, with real model, tokenizer and task;
    submissions are recorded instead of sent to a grader."""

    def __init__(self, tiny_base_model: Path, data_dir: Path, **settings: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
        self.model = AutoModelForCausalLM.from_pretrained(tiny_base_model, dtype=torch.float32)
        self.task = get_task("gsm8k")
        self.problems = self.task.load_test_problems(data_dir, source_dir=DATA)[:8]
        self.config = ExampleGRPOConfig(**settings)
        self.tiny = True
        self.submitted: list[tuple[str, str]] = []
        self.stop = time.time() + 3600.0

    def stop_time(self) -> float:
        return self.stop

    def save_and_submit(self, name: str, phase: str) -> None:
        self.submitted.append((name, phase))


def _slow_clock(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    """Give ``module``'s phases a step clock read from a wall the test moves; returns the wall."""
    wall = [time.time()]
    monkeypatch.setattr(module, "StepClock", functools.partial(StepClock, now=lambda: wall[0]))
    return wall


@pytest.fixture
def make_agent(tiny_base_model: Path, tmp_path: Path) -> Callable[..., _Agent]:
    """An agent of the tiny base model with the example agent's ``settings``."""
    return functools.partial(_Agent, tiny_base_model, tmp_path)


def _sft_steps_taking_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The SFT phase's clock on a wall that each SFT step moves by STEP_S; returns the wall."""
    import torch

    wall = _slow_clock(monkeypatch, sft)
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip_taking_ten_seconds(*args: Any, **kwargs: Any) -> Any:
        wall[0] += STEP_S  # once per SFT step, between its clock's begin and end
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_taking_ten_seconds)
    return wall


def _assert_one_step_then_submitted(agent: _Agent, out: str, phase: str, stop_event: str) -> None:
    """The phase made one step, logged why it stopped (``stop_event``), and submitted its final."""
    assert agent.submitted == [(f"{phase}-final", phase)]
    assert stop_event in out
    assert f"event=phase_end phase={phase} steps=1" in out


def test_the_sft_phase_starts_no_step_that_would_end_past_its_stop(
    make_agent: Callable[..., _Agent], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wall = _sft_steps_taking_ten_seconds(monkeypatch)
    agent = make_agent(sft_epochs=2, sft_batch_size=2, logging_steps=1, sft_min_steps=0)
    stop_at = wall[0] + STOP_AFTER_S
    sft.run_phase(agent, stop_at=stop_at)  # type: ignore[arg-type]
    assert wall[0] <= stop_at
    stop_event = "event=phase_stop phase=sft reason=time epoch=1 step=1 next_step_s=10"
    _assert_one_step_then_submitted(agent, capsys.readouterr().out, "sft", stop_event)


def test_on_a_slow_machine_sft_makes_its_least_steps_past_its_share_and_evaluates_once(
    make_agent: Callable[..., _Agent], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Steps ten times slower than planned (a loaded machine): SFT goes past its time share to the
    steps that make the model learn, within the agent's own stop, and skips the evaluation of an
    epoch it ends behind plan, submitting its last checkpoint instead."""
    wall = _sft_steps_taking_ten_seconds(monkeypatch)
    # 8 problems in steps of 2: 4 steps an epoch; the share allows one step, the least is 6.
    agent = make_agent(sft_epochs=2, sft_batch_size=2, logging_steps=1, sft_min_steps=6)
    agent.stop = wall[0] + 1000.0
    sft.run_phase(agent, stop_at=wall[0] + STOP_AFTER_S)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "event=skip_submit checkpoint=sft-epoch-1 reason=behind" in out
    assert "event=phase_stop phase=sft reason=time epoch=2 step=6" in out
    assert agent.submitted == [("sft-final", "sft")]
    # Where the agent's own stop comes first, it stops SFT whatever the least.
    capsys.readouterr()
    again = make_agent(sft_epochs=2, sft_batch_size=2, logging_steps=1, sft_min_steps=6)
    again.stop = wall[0] + 25.0
    sft.run_phase(again, stop_at=wall[0] + STOP_AFTER_S)  # type: ignore[arg-type]
    assert "event=phase_end phase=sft steps=2" in capsys.readouterr().out


def test_the_fast_grpo_phase_starts_no_step_that_would_end_past_its_stop(
    make_agent: Callable[..., _Agent], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wall = _slow_clock(monkeypatch, fast_grpo)
    real_step = fast_grpo.FastGRPO.step

    def ten_second_step(self: fast_grpo.FastGRPO) -> Any:
        stats = real_step(self)
        wall[0] += STEP_S
        return stats

    monkeypatch.setattr(fast_grpo.FastGRPO, "step", ten_second_step)
    agent = make_agent(grpo_epochs=2, logging_steps=1)
    sizes = GRPOSizes(learning_rate=1e-4, num_generations=2, prompts_per_step=2)
    stop_at = wall[0] + STOP_AFTER_S
    fast_grpo.run_phase(agent, stop_at=stop_at, sizes=sizes, completion_limit=3)
    assert wall[0] <= stop_at
    stop_event = "event=phase_stop phase=grpo reason=time step=1 next_step_s=10"
    _assert_one_step_then_submitted(agent, capsys.readouterr().out, "grpo", stop_event)


def test_the_trl_phase_stops_training_before_a_step_that_would_end_past_its_stop(
    make_agent: Callable[..., _Agent],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The callback TRL's GRPOTrainer runs with (``--rollouts trl``), driven as the Trainer drives it."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    wall = _slow_clock(monkeypatch, example_grpo)
    agent = make_agent()
    stop_at = wall[0] + STOP_AFTER_S
    (callback,) = example_grpo.Agent._callbacks(agent, "grpo", stop_at)  # type: ignore[arg-type]
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), use_cpu=True, report_to="none")
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 5):
        callback.on_step_begin(args, state, control)
        wall[0] += STEP_S
        state.global_step = step
        callback.on_step_end(args, state, control)
        if control.should_training_stop:
            break
    assert state.global_step == 1 and wall[0] <= stop_at
    assert agent.stopped_early  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "event=phase_stop phase=grpo reason=time step=1 next_step_s=10" in out
