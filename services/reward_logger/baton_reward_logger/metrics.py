"""The reward logger's Prometheus metrics: rows written per dataset topic and the writes that failed,
and episodes by grading outcome."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class DatasetMetrics:
    """Rows written per dataset topic, failed writes, and whether a dataset cannot be written now."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter("baton_dataset_rows", "Rows written to the datasets", ["topic"], registry=registry)
        self.failures = Counter("baton_dataset_write_failures", "Dataset files that could not be written (a full "
                                "disk, an unreachable store); their rows are kept and written again", ["topic"],
                                registry=registry)
        self.unwritable = Gauge("baton_dataset_unwritable", "1 while the last write of a dataset failed", ["topic"],
                                registry=registry)


class GradingMetrics:
    """Episodes by grading outcome (`response_row_maker` counts them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.outcomes = Counter("baton_rewards", "Episodes by grading outcome: graded, grading_failed, unknown_item, "
                                "no_item", ["outcome"], registry=registry)
