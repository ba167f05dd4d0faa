"""The order in which ``make test``'s processes take test modules: the costliest first.

pytest-xdist's ``--dist loadscope`` hands each process whole modules from a queue, by default the
modules with the most tests first. Those are unit modules of many quick tests, so the few modules
that take minutes (a container's training run, OpenCompass runs, an operator's cluster) came last,
and one process ran the last of them alone while the other had nothing left. With the suite's own
order (``--no-loadscope-reorder``) and this one, the long modules start first and the many quick ones
fill in around them. The sort is stable: within a module (and between modules of one class) the order
given is kept, the reverse pass's reversed order too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from tests.support.mutation_order import TIERS, OrderedItem, tier

#: Markers of the modules whose tests take minutes each: they start before everything else.
LONGEST = ("opencompass", "containers")


class MarkedItem(OrderedItem, Protocol):
    def get_closest_marker(self, name: str) -> object | None: ...


T = TypeVar("T", bound=MarkedItem)


def cost_class(item: MarkedItem) -> int:
    """Higher is costlier: the longest markers, then end-to-end, integration and unit folders."""
    longest = any(item.get_closest_marker(name) is not None for name in LONGEST)
    return tier(item.path) + (len(TIERS) + 1 if longest else 0)  # above every folder's tier


def costliest_first(items: Sequence[T]) -> list[T]:
    """``items`` with each module's class deciding its place, costliest first; otherwise as given."""
    costs: dict[object, int] = {}
    for item in items:  # a module's class is its costliest test's: its tests stay together
        costs[item.path] = max(costs.get(item.path, 0), cost_class(item))
    return sorted(items, key=lambda item: -costs[item.path])
