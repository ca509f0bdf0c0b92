"""The console's Prometheus metrics: pages served, and how many episodes it holds."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ConsoleMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pages = Counter("baton_console_pages", "Console pages served, by page and status", ["page", "status"],
                             registry=registry)
        self.episodes = Gauge("baton_console_episodes", "Episodes the console holds (the newest of the dataset)",
                              registry=registry)
