"""The warm OpenCompass's server alone, with real OpenCompass: what a run forked from it starts
from, and what is left when it or its server ends. Each "config" here is a Python file that
OpenCompass's config loader executes, standing in for what a run might do."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl.process_group import group_members
from autorl_evaluator.backends.opencompass.backend import (
    Placement,
    compass_environment,
    subprocess_environment,
)
from autorl_evaluator.backends.opencompass.kept_server import KeptServer
from autorl_evaluator.backends.opencompass.warm_opencompass import SERVER, CompassServer, CompassSpec
from autorl_evaluator.failures import EvaluatorFaultError
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.opencompass, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = REPO_ROOT / ".venv-opencompass" / "bin" / "python"


def run_code(server: CompassServer, tmp_path: Path, name: str, body: str, cache: Path) -> Path:
    """A run of ``body`` (as a config OpenCompass loads); its run folder."""
    (tmp_path / f"{name}_body.py").write_text(body, encoding="utf-8")
    config = tmp_path / f"{name}.py"
    config.write_text(f"exec(open({str(tmp_path / (name + '_body.py'))!r}).read(), {{}})\n", encoding="utf-8")
    run = tmp_path / name
    (run / "home").mkdir(parents=True)
    env = subprocess_environment(os.environ, run_dir=run, cache_dir=cache, placement=Placement(gpu=None))
    server.run([str(config), "--work-dir", str(run / "work"), "--debug"], cwd=run, env=env, timeout_s=120,
               log_path=run / "log")  # fmt: skip
    return run


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[KeptServer[CompassSpec, CompassServer], Path]]:
    cache = tmp_path / "cache"
    cache.mkdir()
    kept: KeptServer[CompassSpec, CompassServer] = KeptServer(CompassServer)
    yield kept, cache
    kept.stop()


def start(kept: KeptServer[CompassSpec, CompassServer], cache: Path) -> CompassServer:
    return kept.get(
        CompassSpec(python=PYTHON, pythonpath=""), compass_environment(cache), cache / "compass.log"
    )


def test_each_run_starts_with_fresh_random_state_and_imports_nothing_from_the_workers_folder(
    servers: tuple[KeptServer[CompassSpec, CompassServer], Path], tmp_path: Path
) -> None:
    kept, cache = servers
    server = start(kept, cache)
    seen = []
    for index in range(2):
        out = tmp_path / f"state{index}.txt"
        body = (
            "import sys, numpy, torch, datasets.fingerprint as f\n"
            "state = (f.generate_random_fingerprint(), float(numpy.random.rand()), torch.initial_seed())\n"
            f"open({str(out)!r}, 'w').write(repr((*state, sys.path[0])))\n"
        )
        run_code(server, tmp_path, f"state{index}", body, cache)
        seen.append(eval(out.read_text()))
    assert seen[0][:3] != seen[1][:3] and all(a != b for a, b in zip(seen[0][:3], seen[1][:3], strict=True))
    # `import config` in a run is not the worker's config module, as for the command.
    assert Path(seen[0][3]).resolve() != SERVER.parent


def test_a_run_dumps_its_config_unformatted_and_reads_back_the_same_config(
    servers: tuple[KeptServer[CompassSpec, CompassServer], Path], tmp_path: Path
) -> None:
    """OpenCompass dumps its config to files as a run goes; in a warm run mmengine's yapf layout of
    that text (seconds per evaluation) is skipped, and the file still reads back as the same config."""
    kept, cache = servers
    server = start(kept, cache)
    out, dumped = tmp_path / "dump.txt", tmp_path / "dumped.py"
    body = (
        "import json, mmengine.config.config as module\n"
        "from mmengine.config import Config\n"
        "def refuse(*args, **kwargs):\n"
        "    raise AssertionError('yapf formatted the config')\n"
        "module.FormatCode = refuse\n"
        "source = dict(a=1, b=dict(c=[1, 2.5, (3, \"x'y\")], d='q\"s', e=None), f=[dict(g=True)])\n"
        f"Config(source).dump({str(dumped)!r})\n"
        f"back = Config.fromfile({str(dumped)!r}).to_dict()\n"
        "same = back == Config(source).to_dict()\n"
        f"open({str(out)!r}, 'w').write(json.dumps(same))\n"
    )
    run_code(server, tmp_path, "dump", body, cache)
    assert out.read_text() == "true"  # written only when the dump did not call yapf


def test_a_run_that_writes_into_the_servers_home_gets_the_next_run_a_fresh_server(
    servers: tuple[KeptServer[CompassSpec, CompassServer], Path], tmp_path: Path
) -> None:
    """Library caches resolved when the server imported them point into its own home: a run that
    writes there (a cache the next run would read) ends the server, and its home goes with it."""
    kept, cache = servers
    server = start(kept, cache)
    run_code(server, tmp_path, "reads", "import huggingface_hub\n", cache)
    assert server.alive()  # reading leaves it as it is
    body = (
        "import os, huggingface_hub.constants as h\n"
        "os.makedirs(h.HF_HUB_CACHE, exist_ok=True)\n"
        "open(os.path.join(h.HF_HUB_CACHE, 'left-for-the-next-run'), 'w').write('x')\n"
    )
    run_code(server, tmp_path, "writes", body, cache)
    assert not server.alive() and not server.home.exists()
    fresh = start(kept, cache)
    assert fresh is not server and fresh.alive()
    assert not any(fresh.home.rglob("left-for-the-next-run"))


def test_when_the_server_dies_mid_run_the_worker_ends_the_runs_group_and_says_it_is_its_fault(
    servers: tuple[KeptServer[CompassSpec, CompassServer], Path], tmp_path: Path
) -> None:
    kept, cache = servers
    server = start(kept, cache)
    log = tmp_path / "hang" / "log"
    raised: list[BaseException] = []
    body = (
        "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\n"
        "print('started', flush=True)\ntime.sleep(600)\n"
    )

    def evaluate() -> None:
        try:
            run_code(server, tmp_path, "hang", body, cache)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=evaluate)
    thread.start()
    wait_for(lambda: log.exists() and "started" in log.read_text(), "the run to start", 60)
    [run_pid] = subprocess.run(
        ["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    os.kill(server.process.pid, signal.SIGKILL)  # the out-of-memory killer, say
    thread.join(60)
    assert len(raised) == 1 and isinstance(raised[0], EvaluatorFaultError), raised
    left = group_members(int(run_pid))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_a_server_whose_worker_dies_ends_and_removes_its_folder(
    servers: tuple[KeptServer[CompassSpec, CompassServer], Path],
) -> None:
    """The server gets SIGTERM when the process that started it dies (its parent-death signal): it
    ends, and its folder (socket, home) goes with it."""
    kept, cache = servers
    server = start(kept, cache)
    assert server.folder.exists()
    os.kill(server.process.pid, signal.SIGTERM)
    server.process.wait(timeout=30)
    assert not server.folder.exists()
