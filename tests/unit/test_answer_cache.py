"""The grader's per-experiment answer cache (autorl_grader.answer_cache): an answer is served only
under the version it was built at, and the cache stays within its bounds."""

from __future__ import annotations

from autorl_grader.answer_cache import AnswerCache


def test_an_answer_is_served_only_at_the_version_it_was_built_at() -> None:
    cache = AnswerCache()
    cache.put(1, (3, 10), (0, 100), b"three")
    assert cache.get(1, (3, 10), (0, 100)) == b"three"
    assert cache.get(1, (3, 11), (0, 100)) is None  # a submission was updated since
    assert cache.get(1, (4, 10), (0, 100)) is None  # one was added
    assert cache.get(1, (3, 10), (0, 50)) is None  # another page
    assert cache.get(2, (3, 10), (0, 100)) is None  # another experiment
    # A newer version replaces every page of the older one.
    cache.put(1, (3, 10), (0, 50), b"half")
    cache.put(1, (4, 10), (0, 100), b"four")
    assert cache.get(1, (3, 10), (0, 50)) is None and cache.get(1, (4, 10), (0, 100)) == b"four"
    assert cache.size_bytes == len(b"four")


def test_the_cache_keeps_within_its_bytes_and_pages() -> None:
    cache = AnswerCache(max_bytes=10, pages=2)
    cache.put(1, (1, 0), "a", b"aaaa")
    cache.put(2, (1, 0), "a", b"bbbb")
    cache.get(1, (1, 0), "a")  # used lately: the other experiment leaves first
    cache.put(3, (1, 0), "a", b"cccc")
    assert cache.get(2, (1, 0), "a") is None
    assert cache.get(1, (1, 0), "a") == b"aaaa" and cache.get(3, (1, 0), "a") == b"cccc"
    assert cache.size_bytes == 8
    for page in ("x", "y", "z"):
        cache.put(4, (1, 0), page, b"d")
    assert [cache.get(4, (1, 0), page) for page in ("x", "y", "z")] == [None, b"d", b"d"]
    cache.put(5, (1, 0), "a", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get(5, (1, 0), "a") is None and cache.size_bytes <= 10
