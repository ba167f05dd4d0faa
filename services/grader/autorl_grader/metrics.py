"""The grader's Prometheus metrics (docs/OPERATIONS.md lists each one).

Every value is read from the database when `/metrics` is scraped (`autorl.store.metric_counts`), none is
counted in this process: the grader may run as several processes or replicas, and each of them
answers the same store-wide numbers, before and after a restart.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from autorl.errors import ServiceUnavailableError
from autorl.store import Database
from autorl.store.metric_counts import StoreStats, store_stats


def _labelled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    label: str,
    values: dict[str, int],
) -> Metric:
    family = kind(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def store_metrics(stats: StoreStats) -> Iterator[Metric]:
    yield _labelled(
        GaugeMetricFamily,
        "autorl_submissions",
        "Submissions (agents' and baselines') in each status",
        "status",
        stats.submissions_by_status,
    )
    yield _labelled(
        GaugeMetricFamily,
        "autorl_experiments",
        "Experiments in each phase",
        "phase",
        stats.experiments_by_status,
    )
    yield _labelled(
        GaugeMetricFamily,
        "autorl_queue_depth",
        "Submissions of an open experiment waiting for an evaluator",
        "experiment",
        stats.queue_depth,
    )
    yield GaugeMetricFamily(
        "autorl_evaluations_in_flight",
        "Evaluations running now",
        value=stats.submissions_by_status.get("running", 0),
    )
    yield GaugeMetricFamily(
        "autorl_submissions_waiting_for_identical",
        "Queued submissions that take the result of an identical one being evaluated",
        value=stats.waiting_for_identical,
    )
    yield _labelled(
        CounterMetricFamily,
        "autorl_evaluation_failures",
        "Failed submissions by reason class",
        "reason",
        stats.failures_by_reason,
    )
    yield CounterMetricFamily(
        "autorl_baseline_cache_hits",
        "Baselines that took a cached or identical earlier score instead of an evaluation",
        value=stats.baseline_cache_hits,
    )
    yield CounterMetricFamily(
        "autorl_score_reuses",
        "Agent submissions that took the score of identical files instead of an evaluation",
        value=stats.score_reuses,
    )
    durations = stats.durations
    yield HistogramMetricFamily(
        "autorl_evaluation_duration_seconds",
        "Time each scored evaluation took (reused scores excluded)",
        buckets=[(_bound(bound), count) for bound, count in durations.buckets],
        sum_value=durations.total_seconds,
    )


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class StoreCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        try:
            with self.db.session() as session:
                stats = store_stats(session)
        except ServiceUnavailableError:
            yield GaugeMetricFamily(
                "autorl_database_up", "Whether the database answered this scrape", value=0
            )
            return
        yield GaugeMetricFamily("autorl_database_up", "Whether the database answered this scrape", value=1)
        yield from store_metrics(stats)


def metrics_registry(db: Database) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(db))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
