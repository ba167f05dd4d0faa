"""An answer's ``status`` is one of the store's submission statuses, typed as such: a client (and
the OpenAPI document) sees the exact values, and a pending answer only the unfinished ones."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from autorl.api.answers import FINAL_STATUSES, PendingAnswer, PendingStatusName, SubmissionStatusName
from autorl.store import SubmissionStatus
from tests.support.answers import submission_answer
from tests.support.openapi import grader_document


def test_the_status_literals_are_the_stores_statuses() -> None:
    assert set(get_args(SubmissionStatusName)) == {status.value for status in SubmissionStatus}
    assert set(get_args(PendingStatusName)) == {s.value for s in SubmissionStatus if not s.final}
    assert {s.value for s in SubmissionStatus if s.final} == FINAL_STATUSES


def test_the_document_lists_every_status_an_answer_may_carry() -> None:
    schemas = grader_document()["components"]["schemas"]
    everything = [status.value for status in SubmissionStatus]
    assert schemas["SubmissionAnswer"]["properties"]["status"]["enum"] == everything
    assert schemas["PendingAnswer"]["properties"]["status"]["enum"] == ["queued", "running"]
    final_status = schemas["FinalResult"]["properties"]["status"]["anyOf"]
    assert {"type": "string", "enum": everything} in final_status


@pytest.mark.parametrize("status", ["done", "SCORED", ""])
def test_a_status_the_store_does_not_have_is_refused(status: str) -> None:
    with pytest.raises(ValidationError, match="status"):
        submission_answer(1, status=status)
    with pytest.raises(ValidationError, match="status"):
        PendingAnswer(submission_id=1, status="scored", queue_position=None, ignored_files=[])  # type: ignore[arg-type]
