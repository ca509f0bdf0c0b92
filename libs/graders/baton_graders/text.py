from __future__ import annotations

import regex

from ._types import Grade, GradingError

# The pattern and the answer are both untrusted: a pattern such as (a+)+$ against a long answer
# backtracks for ever. The `regex` module stops a match at a timeout (and lets go of the GIL while
# it runs), so such a grade fails with a reason instead of holding the grader.
REGEX_TIMEOUT_S = 1.0
MAX_PATTERN_CHARS = 10_000


def _normalise(text: str, case_sensitive: bool) -> str:
    text = " ".join(text.split())
    return text if case_sensitive else text.casefold()


def grade_exact(answer: str, reference: str, *, case_sensitive: bool = False) -> Grade:
    a = _normalise(answer, case_sensitive)
    r = _normalise(reference, case_sensitive)
    if a == r:
        return Grade(1.0, "exact match after whitespace normalisation")
    return Grade(0.0, f"expected {r[:80]!r}, got {a[:80]!r}")


def grade_regex(
    answer: str,
    reference: str,
    *,
    mode: str = "fullmatch",
    ignore_case: bool = False,
    strip: bool = True,
    timeout: float = REGEX_TIMEOUT_S,
) -> Grade:
    """``reference`` is the pattern. ``mode`` is ``fullmatch`` or ``search``."""
    if mode not in ("fullmatch", "search"):
        raise ValueError(f"regex mode must be 'fullmatch' or 'search', got {mode!r}")
    if len(reference) > MAX_PATTERN_CHARS:
        raise ValueError(f"reference pattern longer than {MAX_PATTERN_CHARS} characters")
    flags = regex.IGNORECASE if ignore_case else 0
    try:
        # VERSION0: the standard library's `re` semantics, which references were written for.
        pattern = regex.compile(reference, flags | regex.DOTALL | regex.VERSION0)
    except (regex.error, ValueError, TypeError, OverflowError, RecursionError, MemoryError, IndexError) as exc:
        raise ValueError(f"invalid reference pattern {reference[:80]!r}: {exc}") from exc
    text = answer.strip() if strip else answer
    try:
        if mode == "fullmatch":
            match = pattern.fullmatch(text, timeout=timeout, concurrent=True)
        else:
            match = pattern.search(text, timeout=timeout, concurrent=True)
    except TimeoutError as exc:
        raise GradingError(f"regex match timed out after {timeout:g}s") from exc
    if match:
        return Grade(1.0, f"pattern {mode} matched {match.group(0)[:80]!r}")
    verb = "fully match the answer" if mode == "fullmatch" else "occur in the answer"
    return Grade(0.0, f"pattern does not {verb}")
