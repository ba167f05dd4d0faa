"""The order of a mutant's tests: unit tests first, then integration, then end-to-end, each module's
tests together.

mutmut hands each mutant's run the tests that call the changed function as an unordered set and
stops at the first failure (``-x``). In that order a mutant that a unit test kills in milliseconds
often ran grader API tests first, each module of them setting up a database of its own, sometimes
several times as the order went back and forth between modules. Ordered this way, a killed mutant
costs about the time of its fastest killing tier, and each module's fixtures are set up once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

#: The folders under tests/, cheapest first; a test elsewhere runs last.
TIERS = ("unit", "integration", "e2e")


class OrderedItem(Protocol):
    """What the order reads of a collected test (a ``pytest.Item`` has both)."""

    @property
    def path(self) -> Path: ...

    @property
    def location(self) -> tuple[str, int | None, str]: ...


T = TypeVar("T", bound=OrderedItem)


def tier(path: Path) -> int:
    """The position in :data:`TIERS` of a test module's folder."""
    folder = path.parent.name
    return TIERS.index(folder) if folder in TIERS else len(TIERS)


def cheapest_first(items: Sequence[T]) -> list[T]:
    """``items`` by tier, then by module, then by their line in the module (a parametrized test's
    cases keep their order: the sort is stable)."""
    return sorted(items, key=lambda item: (tier(item.path), str(item.path), item.location[1] or 0))
