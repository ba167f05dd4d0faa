"""The server a process keeps between evaluations (the resident engine, the warm OpenCompass): kept
while it is asked for again and alive, replaced otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from autorl_evaluator.backends.opencompass.kept_server import KeptServer
from autorl_evaluator.backends.opencompass.resident_engine import EngineSpec
from autorl_evaluator.backends.opencompass.warm_opencompass import CompassSpec


@dataclass
class FakeServer:
    spec: object
    started: list[object]
    listens: bool = True
    running: bool = True

    def alive(self) -> bool:
        return self.running

    def wait_until_listening(self) -> None:
        if not self.listens:
            raise RuntimeError("did not listen")

    def stop(self) -> None:
        self.running = False


def kept(started: list[FakeServer], listens: bool = True) -> KeptServer[object, FakeServer]:
    def start(spec: object, env: Mapping[str, str], log_path: Path) -> FakeServer:
        server = FakeServer(spec, [], listens=listens)
        started.append(server)
        return server

    return KeptServer(start)


@pytest.mark.parametrize(
    "spec",
    [
        EngineSpec(
            python=Path("/e/python"), engine="vllm", cuda_visible_devices="0", packages=(("vllm", "0.25.0"),)
        ),
        CompassSpec(python=Path("/o/python"), pythonpath="/shim", packages=(("opencompass", "0.5.2"),)),
    ],
)
def test_a_server_is_kept_for_its_spec_and_replaced_when_a_package_changes_or_it_died(
    spec: EngineSpec | CompassSpec, tmp_path: Path
) -> None:
    started: list[FakeServer] = []
    servers = kept(started)
    first = servers.get(spec, {}, tmp_path / "log")
    assert servers.get(spec, {}, tmp_path / "log") is first and len(started) == 1
    # The environment upgraded in place: what runs must be what the evaluation key records.
    upgraded = replace(spec, packages=((spec.packages[0][0], "9.9.9"),))
    second = servers.get(upgraded, {}, tmp_path / "log")
    assert second is not first and not first.alive() and len(started) == 2
    second.running = False  # died between evaluations
    third = servers.get(upgraded, {}, tmp_path / "log")
    assert third is not second and servers.current is third


def test_a_server_that_does_not_listen_is_stopped_and_not_kept(tmp_path: Path) -> None:
    started: list[FakeServer] = []
    servers = kept(started, listens=False)
    with pytest.raises(RuntimeError):
        servers.get("spec", {}, tmp_path / "log")
    assert servers.current is None and not started[0].alive()
