"""Each experiment's fair share of the grader: a token bucket of requests per second and a number of
requests in flight, decided from the request alone (autorl_grader.fair_share)."""

from __future__ import annotations

import pytest

from autorl.store import experiments
from autorl_grader.fair_share import (
    IN_FLIGHT_RETRY_AFTER_S,
    Admission,
    Budget,
    FairShare,
    Refusal,
    request_token,
)

BUDGET = Budget(requests_per_s=2.0, burst=4, in_flight=3)
TOKEN = experiments.hash_token("token-of-a")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def share(**kwargs: int) -> tuple[FairShare, Clock]:
    clock = Clock()
    fair = FairShare(BUDGET, clock=clock, **kwargs)
    fair.know(TOKEN)
    return fair, clock


def admitted(decision: Admission | Refusal) -> Admission:
    assert isinstance(decision, Admission), decision
    decision.release()
    return decision


def test_a_burst_then_the_rate_then_a_refusal_that_names_the_budget_and_when_to_retry() -> None:
    fair, clock = share()
    for _ in range(BUDGET.burst):
        admitted(fair.admit(TOKEN, "10.0.0.1"))
    refused = fair.admit(TOKEN, "10.0.0.1")
    assert isinstance(refused, Refusal)
    # One request's worth refills in 1 / 2 s: the client is told the next whole second.
    assert refused.retry_after_s == 1
    assert "for this experiment" in refused.message
    assert "2 requests per second (bursts of 4) and 3 requests at once" in refused.message
    assert "retry after 1 s" in refused.message
    clock.now += 0.5
    admitted(fair.admit(TOKEN, "10.0.0.1"))
    assert isinstance(fair.admit(TOKEN, "10.0.0.1"), Refusal)
    clock.now += 60  # a long pause refills only up to the burst
    for _ in range(BUDGET.burst):
        admitted(fair.admit(TOKEN, "10.0.0.1"))
    assert isinstance(fair.admit(TOKEN, "10.0.0.1"), Refusal)


def test_requests_in_flight_are_capped_until_one_is_answered() -> None:
    fair, _ = share()
    held = [fair.admit(TOKEN, "10.0.0.1") for _ in range(BUDGET.in_flight)]
    assert all(isinstance(h, Admission) for h in held)
    refused = fair.admit(TOKEN, "10.0.0.1")
    assert isinstance(refused, Refusal) and refused.retry_after_s == IN_FLIGHT_RETRY_AFTER_S
    first = held[0]
    assert isinstance(first, Admission)
    first.release()
    first.release()  # once only: a second release gives back nothing more
    admitted(fair.admit(TOKEN, "10.0.0.1"))
    assert isinstance(fair.admit(TOKEN, "10.0.0.1"), Refusal)  # the burst is spent now


def test_one_experiments_flood_leaves_another_its_share() -> None:
    fair, _ = share()
    other = experiments.hash_token("token-of-b")
    fair.know(other)
    for _ in range(BUDGET.burst):
        admitted(fair.admit(TOKEN, "10.0.0.1"))
    assert isinstance(fair.admit(TOKEN, "10.0.0.1"), Refusal)
    # Same address, another experiment: its own budget, untouched.
    for _ in range(BUDGET.burst):
        admitted(fair.admit(other, "10.0.0.1"))


def test_made_up_tokens_share_their_address_budget_and_a_known_token_is_not_charged_to_it() -> None:
    fair, _ = share()
    for index in range(BUDGET.burst):
        admitted(fair.admit(experiments.hash_token(f"made-up-{index}"), "10.0.0.9"))
    refused = fair.admit(experiments.hash_token("made-up-next"), "10.0.0.9")
    assert isinstance(refused, Refusal)
    assert "from this address without a token the grader knows" in refused.message
    assert isinstance(fair.admit(None, "10.0.0.9"), Refusal)  # no token at all: the same address
    admitted(fair.admit(TOKEN, "10.0.0.9"))  # a known token from that address is its experiment's
    admitted(fair.admit(None, "10.0.0.10"))  # another address has its own
    fair.forget(TOKEN)  # revoked: its requests are the address's again
    assert isinstance(fair.admit(TOKEN, "10.0.0.9"), Refusal)


def test_budgets_kept_are_bounded() -> None:
    fair, _ = share(max_keys=50)
    for index in range(1000):
        admitted(fair.admit(experiments.hash_token(f"spray-{index}"), f"10.1.{index // 250}.{index % 250}"))
    assert len(fair._buckets) <= 50
    for index in range(1000):
        fair.know(experiments.hash_token(f"spray-{index}"))
    assert len(fair._known) <= 50


def test_a_budget_with_requests_in_flight_is_never_dropped_for_room() -> None:
    """Made-up tokens from many addresses fill the budgets kept; an experiment's requests still in
    flight keep its budget, so that dropping it never gives the experiment more places at once."""
    fair, _ = share(max_keys=50)
    held = [fair.admit(TOKEN, "10.0.0.1") for _ in range(BUDGET.in_flight)]
    assert all(isinstance(h, Admission) for h in held)
    for index in range(1000):
        admitted(fair.admit(experiments.hash_token(f"spray-{index}"), f"10.1.{index // 250}.{index % 250}"))
    assert len(fair._buckets) <= 50
    refused = fair.admit(TOKEN, "10.0.0.1")
    assert isinstance(refused, Refusal) and refused.retry_after_s == IN_FLIGHT_RETRY_AFTER_S
    for admission in held:
        assert isinstance(admission, Admission)
        admission.release()
    admitted(fair.admit(TOKEN, "10.0.0.1"))


@pytest.mark.parametrize(
    ("path", "headers", "token"),
    [
        ("/a/abc/scores", [], "abc"),
        ("/a/abc", [], "abc"),
        ("/scores", [(b"authorization", b"Bearer xyz")], "xyz"),
        ("/scores", [(b"authorization", b"bearer  xyz ")], "xyz"),
        ("/scores", [(b"authorization", b"Basic xyz")], None),
        ("/scores", [], None),
        ("/a//scores", [], None),
    ],
)
def test_the_token_comes_from_the_capability_url_or_the_bearer_header(
    path: str, headers: list[tuple[bytes, bytes]], token: str | None
) -> None:
    assert request_token({"type": "http", "path": path, "headers": headers}) == token
