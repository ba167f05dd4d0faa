"""The chat template renderer: where its child runs, and whose failure each outcome is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autorl.checkpoints import chat_template, template_renderer
from autorl.checkpoints.chat_template import ChatTemplate, ChatTemplateError

TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)
TURNS = [{"role": "user", "content": "What is 2 + 3?"}]


def test_the_child_runs_in_an_interpreter_that_does_not_have_this_package(tmp_path: Path) -> None:
    """An evaluator environment where the package is on PYTHONPATH only (the isolated child never
    sees PYTHONPATH): the renderer still answers, because its file imports nothing of ours."""
    copy = tmp_path / "elsewhere" / "renderer.py"
    copy.parent.mkdir()
    copy.write_text(Path(template_renderer.__file__).read_text(encoding="utf-8"), encoding="utf-8")
    request = (
        '{"template": "{{ messages[0].content }}!", "conversations": [[{"role": "user", '
        '"content": "hi"}]], "variables": {}, "add_generation_prompt": false}'
    )
    done = subprocess.run(
        [sys.executable, "-I", str(copy), "5"], input=request, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"rendered": ["hi!"]}'
    assert ChatTemplate(TEMPLATE).render_batch([TURNS], add_generation_prompt=True) == [
        "<user>What is 2 + 3?<a>"
    ]


def test_a_renderer_that_cannot_run_says_so_and_does_not_blame_the_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interpreter without jinja2 (a broken evaluator environment): the error names the renderer
    and carries its own output for the operator, instead of calling the template too costly."""
    broken = tmp_path / "renderer.py"
    broken.write_text("import jinja2_is_not_here\n", encoding="utf-8")
    monkeypatch.setattr(template_renderer, "__file__", str(broken))
    with pytest.raises(ChatTemplateError, match="renderer could not run") as raised:
        ChatTemplate(TEMPLATE).render_batch([TURNS], add_generation_prompt=True)
    assert "jinja2_is_not_here" in str(raised.value)
    assert "too much" not in str(raised.value)


def test_a_template_over_its_cpu_limit_is_named_by_the_signal_that_stopped_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chat_template, "RENDER_BASE_TIMEOUT_S", 1.5)
    spin = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError) as raised:
        ChatTemplate(spin).render_batch([TURNS], add_generation_prompt=True)
    # Stopped by the wall-clock timeout or by its CPU limit, whichever comes first.
    assert "did not finish rendering" in str(raised.value) or "SIGXCPU" in str(raised.value)
    assert "base model" in str(raised.value)
