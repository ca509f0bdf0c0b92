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

from ._types import Grade, GradingError
from .choice import extract_choice, grade_choice
from .code import SandboxUnavailable, extract_code, grade_code
from .evalsets import EVAL_METADATA_KEY, EvalItem, EvalRegistry, EvalSetError
from .isolation import IsolatedGrader
from .math_answer import extract_math_answer, grade_math, parse_number
from .registry import GRADERS, MAX_ANSWER_CHARS, grade
from .text import grade_exact, grade_regex

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
