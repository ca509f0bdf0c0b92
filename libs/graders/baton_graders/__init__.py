"""Answer graders.

``grade(grader, answer, reference, **opts)`` returns a :class:`Grade` with a score in [0, 1]
and a short human-readable detail. Graders:

- ``math``: final-answer extraction and numeric/LaTeX normalisation.
- ``choice``: multiple-choice letter extraction.
- ``code``: runs the candidate's code against reference unit tests in a namespace sandbox.
- ``exact``: whitespace- and case-normalised string equality.
- ``regex``: the reference is a regular expression (matched with a timeout).

A grader either returns a Grade or raises: ``ValueError`` for a bad grader name, reference or
option, :class:`GradingError` when the answer could not be graded (a timeout, a sandbox that
cannot be built). Neither may be read as "wrong". :class:`IsolatedGrader` runs graders in a child
process with a wall-clock limit; :class:`EvalRegistry` holds the operator's evaluation sets.
"""

from __future__ import annotations

from collections.abc import Callable

from ._types import Grade, GradingError
from .choice import extract_choice, grade_choice
from .code import SandboxUnavailable, extract_code, grade_code
from .math_answer import extract_math_answer, grade_math, parse_number
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


from .evalsets import EVAL_METADATA_KEY, EvalItem, EvalRegistry, EvalSetError  # noqa: E402 - uses GRADERS
from .isolation import IsolatedGrader  # noqa: E402 - uses grade()

__all__ = [
    "EVAL_METADATA_KEY",
    "GRADERS",
    "MAX_ANSWER_CHARS",
    "EvalItem",
    "EvalRegistry",
    "EvalSetError",
    "Grade",
    "GradingError",
    "IsolatedGrader",
    "SandboxUnavailable",
    "extract_choice",
    "extract_code",
    "extract_math_answer",
    "grade",
    "grade_choice",
    "grade_code",
    "grade_exact",
    "grade_math",
    "grade_regex",
    "parse_number",
]
