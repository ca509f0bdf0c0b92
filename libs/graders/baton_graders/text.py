from __future__ import annotations

import re

from ._types import Grade


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
) -> Grade:
    """``reference`` is the pattern. ``mode`` is ``fullmatch`` or ``search``."""
    if mode not in ("fullmatch", "search"):
        raise ValueError(f"regex mode must be 'fullmatch' or 'search', got {mode!r}")
    flags = re.IGNORECASE if ignore_case else 0
    try:
        pattern = re.compile(reference, flags | re.DOTALL)
    except re.error as exc:
        raise ValueError(f"invalid reference pattern {reference!r}: {exc}") from exc
    text = answer.strip() if strip else answer
    match = pattern.fullmatch(text) if mode == "fullmatch" else pattern.search(text)
    if match:
        return Grade(1.0, f"pattern {mode} matched {match.group(0)[:80]!r}")
    verb = "fully match the answer" if mode == "fullmatch" else "occur in the answer"
    return Grade(0.0, f"pattern does not {verb}")
