"""The judge: a worker that scores the answers of an exploration group, so the client can get the best.

The judge reads the question and the candidates' answers, numbered, and replies with one score from
0 (wrong) to 10 (right and complete) per answer as JSON. Its scores choose the answer the client
gets, and travel to the reward logger as feedback on each candidate's response (source "judge"),
so groups without a reference answer still teach the trainer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

SYSTEM = """You judge answers to a question. Read the question and every numbered answer, then score \
each answer from 0 (wrong) to 10 (right and complete). Reply with JSON only, one score per answer in \
their order: {"scores": [<score of answer 1>, <score of answer 2>, ...]}"""

# A judge needs the answers, not the candidates' whole essays; long answers are cut in the middle.
MAX_ANSWER_CHARS = 4000


def _cut(text: str) -> str:
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    half = MAX_ANSWER_CHARS // 2
    return text[:half] + "\n[...]\n" + text[-half:]


def judge_messages(question: str, answers: Sequence[str]) -> list[dict[str, str]]:
    parts = [f"Question:\n{question}"] + [f"Answer {i + 1}:\n{_cut(a)}" for i, a in enumerate(answers)]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_scores(text: str, n: int) -> list[float]:
    """The judge's scores scaled to [0, 1]; ValueError saying why when the reply holds none."""
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            continue
        scores = data.get("scores") if isinstance(data, dict) else None
        if not isinstance(scores, list):
            continue
        if len(scores) != n:
            raise ValueError(f"the judge scored {len(scores)} answers, not {n}")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 <= s <= 10 for s in scores):
            raise ValueError(f"the judge's scores are not numbers from 0 to 10: {scores}")
        return [float(s) / 10 for s in scores]
    raise ValueError(f"the judge's reply holds no {{\"scores\": [...]}} object: {text[:200]!r}")


def best(scores: Sequence[float]) -> int:
    """The index of the highest score; ties go to the lower index (the client's own candidate first)."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))
