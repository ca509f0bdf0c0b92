"""Multiple-choice letter extraction.

Explicit statements win over incidental letters: "the answer is (C)", "Answer: C", a boxed or
bold letter, then a parenthesised letter, and only then the last standalone capital letter.
The standalone fallback skips the English words "A" and "I" when they start a sentence-like
phrase ("A dog", "I think"), since those are far more often words than options.
"""

from __future__ import annotations

import re

from ._types import Grade

DEFAULT_LETTERS = "ABCDEFGHIJ"


def _explicit_patterns(letters: str) -> list[re.Pattern[str]]:
    cls = f"[{re.escape(letters)}{re.escape(letters.lower())}]"
    # Whitespace runs are possessive (`\s*+`): every element after one starts with a non-space, so
    # nothing is lost, and a long run of spaces is not re-split between neighbouring `\s*` (which
    # made "answer" followed by 20,000 spaces take minutes).
    return [
        # "The answer is (C)", "the correct answer is: C", "answer is option C"
        re.compile(
            rf"answer\s*+(?:is|would\s++be|should\s++be)?\s*+(?:option|choice)?\s*+[:\-]?\s*+"
            rf"(?:\*\*|\(|\[)*+\s*+({cls})(?![A-Za-z])",
            re.IGNORECASE,
        ),
        re.compile(rf"\\boxed\{{\s*+(?:\\text\{{)?\s*+\(?({cls})\)?\s*+\}}?\s*+\}}"),
        re.compile(rf"\*\*\s*+\(?({cls})\)?[.:]?\s*+\*\*"),
    ]


def extract_choice(text: str, letters: str = DEFAULT_LETTERS) -> tuple[str | None, str]:
    """Return ``(letter, how it was found)``; letter is upper-case or None."""
    letters = letters.upper()
    if not letters or not letters.isalpha():
        raise ValueError(f"letters must be alphabetic, got {letters!r}")
    for how, pattern in zip(("answer phrase", "boxed", "bold"), _explicit_patterns(letters), strict=True):
        found = [
            m.group(1)
            for m in pattern.finditer(text)
            # "the answer is a bit unclear": a lower-case letter followed by a word is prose.
            if not (m.group(1).islower() and re.match(r"\s+[a-z]", text[m.end() : m.end() + 2]))
        ]
        if found:
            return found[-1].upper(), how
    cls = f"[{re.escape(letters)}]"
    parenthesised = re.findall(rf"\(({cls})\)", text)
    if parenthesised:
        return parenthesised[-1], "parenthesised"
    standalone = []
    for m in re.finditer(rf"(?<![A-Za-z0-9'])({cls})(?![A-Za-z0-9'])", text):
        letter = m.group(1)
        after = text[m.end() : m.end() + 3]
        if letter in "AI" and re.match(r" [a-z]", after):
            continue
        standalone.append(letter)
    if standalone:
        return standalone[-1], "last standalone letter"
    return None, "no letter found"


def _reference_letter(reference: str, letters: str) -> str:
    ref = reference.strip()
    bare = ref.strip("()[]. *").upper()
    if len(bare) == 1 and bare in letters.upper():
        return bare
    letter, _ = extract_choice(ref, letters)
    if letter is None:
        raise ValueError(f"reference {reference!r} holds no option letter among {letters!r}")
    return letter


def grade_choice(answer: str, reference: str, *, letters: str = DEFAULT_LETTERS) -> Grade:
    ref = _reference_letter(reference, letters)
    letter, how = extract_choice(answer, letters)
    if letter is None:
        return Grade(0.0, f"no option letter among {letters} found; expected {ref}")
    if letter == ref:
        return Grade(1.0, f"chose {letter} ({how}), correct")
    return Grade(0.0, f"chose {letter} ({how}), expected {ref}")
