"""``autorl run`` says what its checks after the agent could not verify: an agent that removes the
checkpoint it submitted before it ends leaves the twin split unverified, said in the summary and in
the run's note, never a silent empty ``twin_score``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_local_run import write_agent
from tests.support.infra import free_port

pytestmark = pytest.mark.slow


def test_a_final_removed_before_the_agent_ends_leaves_the_twin_split_unverified(
    tmp_path: Path, autorl_run: Callable[..., Any]
) -> None:
    agent = write_agent(
        tmp_path,
        """
        import shutil
        print(call("/submit", {"model_path": save("copy")}))
        shutil.rmtree(os.path.join(OUT, "copy"))
        """,
    )
    run = autorl_run(
        "-a", agent, "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "120", "--port", str(free_port())
    )

    assert run.code == 0, run.stderr
    (row,) = run.results()
    assert row["twin_score"] is None and row["test_overlap"] == 0
    assert "twin split   unverified: the final's folder can no longer be read" in run.stdout
