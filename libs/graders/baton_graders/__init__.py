"""Answer graders.

``grade(grader, answer, reference, **opts)`` returns a :class:`Grade` with a score in [0, 1]
and a short human-readable detail. Graders:

- ``math``: final-answer extraction and numeric/LaTeX normalisation.
- ``choice``: multiple-choice letter extraction.
- ``code``: runs the candidate's code against reference unit tests in a sandboxed subprocess.
- ``exact``: whitespace- and case-normalised string equality.
- ``regex``: the reference is a regular expression.
"""

from __future__ import annotations

from collections.abc import Callable

from ._types import Grade
from .choice import extract_choice, grade_choice
from .code import extract_code, grade_code
from .math_answer import extract_math_answer, grade_math, parse_number
from .text import grade_exact, grade_regex

GraderFn = Callable[..., Grade]

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
    return fn(str(answer), str(reference), **opts)


__all__ = [
    "GRADERS",
    "Grade",
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
