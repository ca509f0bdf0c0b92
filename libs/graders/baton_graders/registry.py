"""The graders by name, and `grade`, which looks one up. A module of its own, not the package's
__init__, so that the evaluation sets (which __init__ imports) name GRADERS without an import circle."""

from __future__ import annotations

from collections.abc import Callable

from ._types import Grade, GradingError
from .choice import grade_choice
from .code import grade_code
from .math_answer import grade_math
from .text import grade_exact, grade_regex

GraderFn = Callable[..., Grade]

# Longer answers are not graded at all: every grader stays fast on anything below this.
MAX_ANSWER_CHARS = 1_000_000

GRADERS: dict[str, GraderFn] = {
    "math": grade_math,
    "choice": grade_choice,
    "code": grade_code,
    "exact": grade_exact,
    "regex": grade_regex,
}


def grade(grader: str, answer: str, reference: str, **opts) -> Grade:
    """Grade ``answer`` against ``reference`` with the named grader."""
    fn = GRADERS.get(grader)
    if fn is None:
        known = ", ".join(sorted(GRADERS))
        raise ValueError(f"unknown grader {grader!r}; known graders: {known}")
    if answer is None:
        answer = ""
    answer, reference = str(answer), str(reference)
    if len(answer) > MAX_ANSWER_CHARS:
        raise GradingError(f"answer of {len(answer)} characters is too long to grade (limit {MAX_ANSWER_CHARS})")
    return fn(answer, reference, **opts)
