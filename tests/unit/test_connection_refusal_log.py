"""The grader logs refused connections per port, reason and client: one client's flood is logged
sparsely and never hides another's refusal (the controller's on the admin port, another agent's)."""

from __future__ import annotations

from autorl_grader.http_server import (
    LOGGED_REFUSALS,
    LOGGED_REFUSALS_EVERY,
    REFUSAL_KEYS,
    ConnectionLimits,
    ConnectionSlots,
)


def test_a_flood_is_logged_sparsely_and_another_client_s_refusal_is_still_logged() -> None:
    slots = ConnectionSlots(ConnectionLimits())
    flood = [
        slots.count_refusal(8000, "too_many_connections", "10.0.0.7")
        for _ in range(3 * LOGGED_REFUSALS_EVERY)
    ]
    logged = [same for same in flood if same]
    assert logged[:LOGGED_REFUSALS] == list(range(1, LOGGED_REFUSALS + 1))
    assert logged[LOGGED_REFUSALS:] == [LOGGED_REFUSALS_EVERY * k for k in (1, 2, 3)]
    # After the flood, the controller refused on the admin port, another agent on the agent port,
    # and the flooding client for another reason: each is logged at once.
    assert slots.count_refusal(8001, "too_many_connections", "10.0.0.2") == 1
    assert slots.count_refusal(8000, "too_many_connections", "10.0.0.9") == 1
    assert slots.count_refusal(8000, "request_too_slow", "10.0.0.7") == 1
    assert slots.refused == 3 * LOGGED_REFUSALS_EVERY + 3


def test_clients_past_the_counted_keys_share_one_count() -> None:
    """Many addresses cannot grow the counts without bound: past REFUSAL_KEYS they share one."""
    slots = ConnectionSlots(ConnectionLimits())
    for n in range(REFUSAL_KEYS):
        assert (
            slots.count_refusal(8000, "too_many_connections", f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
            == 1
        )
    shared = [
        slots.count_refusal(8000, "too_many_connections", f"192.168.0.{n}")
        for n in range(LOGGED_REFUSALS + 5)
    ]
    assert (
        shared[:LOGGED_REFUSALS] == list(range(1, LOGGED_REFUSALS + 1))
        and shared[LOGGED_REFUSALS:] == [0] * 5
    )
