from __future__ import annotations

from dataclasses import dataclass


class GradingError(RuntimeError):
    """The answer could not be graded (not: it was graded wrong); no reward may be derived from it."""


@dataclass(frozen=True)
class Grade:
    score: float
    detail: str

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.score) <= 1.0:
            raise ValueError(f"score must lie in [0, 1], got {self.score}")
        object.__setattr__(self, "score", float(self.score))

    @property
    def passed(self) -> bool:
        return self.score >= 1.0
