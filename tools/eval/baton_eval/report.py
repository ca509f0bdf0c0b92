"""Numbers as the evaluation reports write them: rounded plain floats, so a JSON report is stable and
short whether a figure came from numpy or Python."""

from __future__ import annotations


def rounded(x: float, nd: int = 4) -> float:
    """`x` as a Python float rounded to `nd` decimals."""
    return float(round(float(x), nd))
