"""The workers a service may send work to, by name, and those added to the configuration file while it
runs (a router restarted with a new worker plans for it before this service restarts).

Looking a worker up never touches the disk; only `refresh` reads the file again, and only when it has
changed since the last look (`ConfigWatch`). The synthesizer refreshes when a plan names a worker it
does not know, the executor when a task does; their cores (the synthesizer's `Runs`, the executor's
runner) only look workers up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence

from baton_platform.config import ConfigWatch, WorkerConfig

log = logging.getLogger(__name__)


class WorkerPool(Mapping[str, WorkerConfig]):
    def __init__(self, workers: Sequence[WorkerConfig], watch: ConfigWatch | None = None) -> None:
        self._workers = {w.name: w for w in workers}
        self._watch = watch

    def __getitem__(self, name: str) -> WorkerConfig:
        return self._workers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def lacks(self, names: Iterable[str]) -> list[str]:
        """The names among `names` that are not workers of the pool, sorted."""
        return sorted({n for n in names if n not in self._workers})

    def refresh(self) -> list[WorkerConfig]:
        """The workers added to the configuration file since the last look, now in the pool; none when
        the file is unchanged, does not load, or there is no file to watch."""
        fresh = self._watch.changed() if self._watch else None
        added = [w for w in fresh.workers if w.name not in self._workers] if fresh else []
        self._workers.update({w.name: w for w in added})
        if added:
            log.info("workers added to the configuration: %s", ", ".join(w.name for w in added))
        return added

    def drop(self, names: Iterable[str]) -> None:
        """Forget workers that could not be served, so that the file's next change offers them again."""
        for name in names:
            self._workers.pop(name, None)
