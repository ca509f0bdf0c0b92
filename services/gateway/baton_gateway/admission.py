"""Admission control: a replica holds at most `limit` requests waiting for answers. Past that it sheds
new ones at once with 429 and a Retry-After, rather than queueing them until their deadline: under
overload a queue only turns every answer late, while a shed client can back off or go elsewhere.

The Retry-After is the time the backlog above the limit takes to drain at the rate answers came back
over the last `window_s` seconds (OpenAI's clients honour it when they retry a 429).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from baton_gateway.api import ApiError

MAX_RETRY_AFTER_S = 60


class Admission:
    def __init__(self, limit: int, *, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._window = window_s
        self._clock = clock
        self._answered: deque[float] = deque()

    def answered(self) -> None:
        """A waiting request got its final response."""
        now = self._clock()
        self._answered.append(now)
        self._trim(now)

    def admit(self, waiting: int) -> None:
        """Raise a 429 when `waiting` requests already hold this replica's every place."""
        if waiting < self.limit:
            return
        rate = self.rate()
        retry = min(MAX_RETRY_AFTER_S, max(1, math.ceil((waiting - self.limit + 1) / rate))) if rate else 1
        raise ApiError(429, f"Baton is at capacity: {waiting} requests are waiting for answers on this replica. "
                       f"Please try again in {retry}s.", type="server_overloaded", code="overloaded",
                       headers={"retry-after": str(retry)})

    def rate(self) -> float:
        """Answers per second over the window."""
        self._trim(self._clock())
        return len(self._answered) / self._window

    def _trim(self, now: float) -> None:
        while self._answered and self._answered[0] < now - self._window:
            self._answered.popleft()
