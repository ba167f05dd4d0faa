"""The grading API's limits on a body admit the largest requests the platform and a well-behaved
agent send, however their strings are written (JSON escapes of astral characters: 12 bytes each)."""

from __future__ import annotations

import json

from autorl.api.request_bodies import MAX_MODEL_PATH_BYTES
from autorl.api.request_limits import MAX_AGENT_BODY_BYTES, MAX_BODY_BYTES
from autorl.experiment import MAX_KNOWN_CHECKPOINTS
from autorl.provenance.unverified import MAX_MESSAGE_CHARS

ASTRAL = "\U0001f600"  # four bytes of UTF-8, twelve as JSON escapes


def size(body: object) -> int:
    return len(json.dumps(body).encode())


def test_the_longest_submit_fits_an_agents_limit() -> None:
    path = ASTRAL * (MAX_MODEL_PATH_BYTES // len(ASTRAL.encode()))
    assert size({"model_path": path, "gpu": 0}) <= MAX_AGENT_BODY_BYTES


def test_the_platforms_largest_bodies_fit_the_limit() -> None:
    end = {"status": "completed", "message": ASTRAL * MAX_MESSAGE_CHARS}
    registration = {
        "name": "e" * 253,
        "task": "gsm8k",
        "model": "/models/" + "m" * 255,
        "timeout_s": 3600,
        "workspace": "/w/" + "x" * 4096,
        "base_model_dir": "/b/" + "x" * 4096,
        "known_checkpoints": [ASTRAL * 512] * MAX_KNOWN_CHECKPOINTS,
    }
    assert max(size(end), size(registration)) <= MAX_BODY_BYTES
