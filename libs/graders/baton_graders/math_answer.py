"""Final-answer extraction and normalisation for math answers.

Both the candidate and the reference go through the same normalisation, so a reference may be
written as ``\\frac{1}{2}``, ``1/2``, ``0.5`` or ``#### 0.5``. Numbers are compared exactly as
fractions (so ``0.5`` equals ``1/2``) unless ``rel_tol`` is given; answers that are not numbers
fall back to a normalised string comparison.
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction

from ._types import Grade

# Bounds on what is parsed as a number. Answers and references are untrusted text: without them
# "1e999999999" builds a billion-digit integer, "1" + "/1" * 5000 overflows the parser's
# recursion, and a long chain of brace openers makes brace matching quadratic.
MAX_NUMBER_CHARS = 400       # a single number or fraction token
MAX_EXPONENT = 1000          # |e| in 1e±e
MAX_EXPRESSION_CHARS = 200   # an arithmetic expression such as (1)/((1)/(2))
MAX_EXPRESSION_DEPTH = 32    # nesting of that expression
MAX_PARSE_CHARS = 4000       # text handed to parse_number
_MAX_BITS = 8000  # about 2,400 digits: well inside what int() and str() accept
_EXPONENT = re.compile(r"[eE]([-+]?\d+)")

_NUMBER = r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+−]?\.\d+(?:[eE][-+]?\d+)?"
# A fraction is tried before a plain number so that "3/4" is not read as "4".
_NUMBER_OR_FRACTION = re.compile(rf"(?:{_NUMBER})\s*/\s*(?:{_NUMBER})|(?:{_NUMBER})")
_ANSWER_PHRASE = re.compile(
    r"(?:final\s+answer|the\s+answer\s+is|answer\s*[:=]|answer\s+is)", re.IGNORECASE
)


def _balanced_after(text: str, start: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``text[start]`` (nested braces allowed)."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of the ``}`` that closes it, in one pass."""
    pairs, stack = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}``, nested braces included."""
    found = None
    pairs: dict[int, int] | None = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*+", text):
        if m.end() < len(text) and text[m.end()] == "{":
            # Matched once for the whole text: one scan per \boxed made many unclosed ones quadratic.
            pairs = _closing_braces(text) if pairs is None else pairs
            close = pairs.get(m.end())
            if close is not None:
                found = text[m.end() + 1 : close]
        else:
            # "\boxed 5" without braces: take the next token.
            tail = re.match(r"\s*([^\s$]+)", text[m.end() : m.end() + MAX_NUMBER_CHARS])
            if tail:
                found = tail.group(1)
    return found


def _replace_frac(text: str) -> str:
    """Rewrite ``\\frac{a}{b}`` (and dfrac/tfrac, nested) as ``(a)/(b)``."""
    out = text
    for _ in range(20):
        m = re.search(r"\\[dt]?frac\s*", out)
        if not m:
            break
        num = _balanced_after(out, m.end())
        if num is None:
            # "\frac12" shorthand: two single characters.
            short = re.match(r"(\d)(\d)", out[m.end() :])
            if not short:
                break
            out = out[: m.start()] + f"({short.group(1)})/({short.group(2)})" + out[m.end() + 2 :]
            continue
        den = _balanced_after(out, num[1])
        if den is None:
            break
        a, b = num[0].strip(), den[0].strip()
        simple = re.fullmatch(r"[\d.,]+", a) and re.fullmatch(r"[\d.,]+", b)
        out = out[: m.start()] + (f"{a}/{b}" if simple else f"({a})/({b})") + out[den[1] :]
    return out


def _strip_latex(text: str) -> str:
    s = text
    s = re.sub(r"\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\mbox\{[^{}]*\}", " ", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\[,;:!]|\\quad|\\qquad|~", " ", s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "%").replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "")
    s = s.replace("−", "-")
    s = _replace_frac(s)
    return s


def _to_fraction(token: str) -> Fraction | None:
    token = token.replace(",", "").replace("−", "-").strip()
    if len(token) > MAX_NUMBER_CHARS:
        return None
    exponent = _EXPONENT.search(token)
    if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
        return None
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def parse_number(text: str) -> Fraction | None:
    """Parse ``text`` as a single number if it is one (after unit/LaTeX stripping), else None.

    Accepts integers, decimals, thousands separators, ``a/b``, ``\\frac{a}{b}``, a leading
    currency sign, trailing units or a trailing period. ``-0`` parses as 0.
    """
    if len(text) > MAX_PARSE_CHARS:
        return None
    s = _strip_latex(text).strip()
    s = re.sub(r"^[^\d\-+.(]*", "", s)  # leading currency or words such as "x ="
    s = s.rstrip(" .;:!%")
    # Trailing units such as "cm" or "m/s^2", but not an exponent such as "1e3".
    s = re.sub(r"(?<=[\d.)])\s*(?![eE][-+]?\d)[A-Za-z][A-Za-z\s.^0-9/]*$", "", s)
    s = s.rstrip(" .%")
    if re.fullmatch(_NUMBER, s):
        return _to_fraction(s)
    if "/" in s and re.fullmatch(r"[\d.,()+\-*/\s]+", s):
        return _eval_arithmetic(s)
    return None


def _eval_arithmetic(expr: str) -> Fraction | None:
    """Exact value of a small arithmetic expression such as ``(1)/((1)/(2))``, else None."""
    if len(expr) > MAX_EXPRESSION_CHARS or _nesting(expr) > MAX_EXPRESSION_DEPTH:
        return None
    if re.search(r"\d,(?!\d{3}(?!\d))", expr):
        return None  # a comma that is not a thousands separator
    expr = expr.replace(",", "")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node: ast.AST, depth: int = 0) -> Fraction:
        if depth > 2 * MAX_EXPRESSION_DEPTH:
            raise ValueError("expression nested too deeply")
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            number = _to_fraction(ast.get_source_segment(expr, node) or str(node.value))
            if number is None:
                raise ValueError("not a number within bounds")
            return number
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            inner = value(node.operand, depth + 1)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            left, right = value(node.left, depth + 1), value(node.right, depth + 1)
            if isinstance(node.op, ast.Add):
                result = left + right
            elif isinstance(node.op, ast.Sub):
                result = left - right
            elif isinstance(node.op, ast.Mult):
                result = left * right
            else:
                result = left / right
            if max(result.numerator.bit_length(), result.denominator.bit_length()) > _MAX_BITS:
                raise ValueError("number too large")
            return result
        raise ValueError("unsupported expression")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def _nesting(expr: str) -> int:
    """Deepest parenthesis nesting, and the length of the longest operator chain, of ``expr``."""
    depth = deepest = 0
    for ch in expr:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    operators = len(re.findall(r"[-+*/]", expr))
    return max(deepest, operators)


def _last_number(text: str) -> str | None:
    matches = list(_NUMBER_OR_FRACTION.finditer(_strip_latex(text)))
    return matches[-1].group(0) if matches else None


def _first_number(text: str) -> str | None:
    m = _NUMBER_OR_FRACTION.search(_strip_latex(text))
    return m.group(0) if m else None


def extract_math_answer(text: str) -> tuple[str | None, str]:
    """Return ``(final answer text, how it was found)``.

    Priority: the last ``\\boxed{}``; text after the last ``####``; the first number after the
    last "answer is"/"Answer:" phrase; the last number anywhere.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        if tail:
            return tail.splitlines()[0].strip(), "####"
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        tail = text[phrases[-1].end() :]
        number = _first_number(tail)
        if number is not None:
            return number, "answer phrase"
    number = _last_number(text)
    if number is not None:
        return number, "last number"
    stripped = text.strip()
    return (stripped or None), "whole text"


def _canonical_text(text: str) -> str:
    s = _strip_latex(text)
    s = re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", "", s).rstrip(".").casefold()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s


def _reference_value(reference: str) -> tuple[Fraction | None, str]:
    ref = reference.strip()
    boxed = last_boxed(ref)
    if boxed is not None:
        ref = boxed
    elif "####" in ref:
        ref = ref.rsplit("####", 1)[1].strip()
    value = parse_number(ref)
    if value is None:
        # A reference such as "The answer is 12" still has one clear number.
        number = _last_number(ref)
        if number is not None and len(_NUMBER_OR_FRACTION.findall(_strip_latex(ref))) == 1:
            value = parse_number(number)
    return value, ref


def grade_math(answer: str, reference: str, *, rel_tol: float = 0.0, abs_tol: float = 0.0) -> Grade:
    ref_value, ref_text = _reference_value(reference)
    extracted, how = extract_math_answer(answer)
    if extracted is None:
        return Grade(0.0, "no answer found")
    cand_value = parse_number(extracted)
    if cand_value is None and how in ("boxed", "####"):
        # A boxed expression with words around the number, e.g. "x = 5 cm".
        number = _last_number(extracted)
        if number is not None and ref_value is not None:
            cand_value = parse_number(number)
    if ref_value is not None:
        if cand_value is None:
            return Grade(0.0, f"expected {ref_value}, found no number in {extracted[:60]!r} ({how})")
        equal = cand_value == ref_value
        if not equal and (rel_tol or abs_tol):
            try:
                equal = math.isclose(float(cand_value), float(ref_value), rel_tol=rel_tol, abs_tol=abs_tol)
            except OverflowError:
                equal = False
        if equal:
            return Grade(1.0, f"{extracted[:60]!r} equals {ref_text[:60]!r} ({how})")
        return Grade(0.0, f"{extracted[:60]!r} != {ref_text[:60]!r} ({how})")
    if _canonical_text(extracted) == _canonical_text(ref_text):
        return Grade(1.0, f"{extracted[:60]!r} matches {ref_text[:60]!r} as text ({how})")
    return Grade(0.0, f"{extracted[:60]!r} does not match {ref_text[:60]!r} ({how})")
