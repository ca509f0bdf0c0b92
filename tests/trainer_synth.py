"""Synthetic outcome matrices for the trainer and evaluation tests.

Each query belongs to a topic that shows in its wording; every model has a per-topic accuracy,
so the best model depends on the query and a text-based router can learn it. Answers are option
letters; a wrong model picks a distractor, and the two "twin" models share their mistakes.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

TOPICS = {
    "algebra": ["solve", "equation", "variable", "polynomial", "root"],
    "history": ["empire", "century", "treaty", "dynasty", "revolution"],
    "biology": ["cell", "protein", "enzyme", "organism", "gene"],
}
FILLER = ["which", "of", "the", "following", "is", "true", "about", "this", "statement", "given"]

# Per-topic accuracy of each model; "cheap" is good at history only and costs a tenth as much.
ACCURACY = {
    "alg-expert": {"algebra": 0.95, "history": 0.30, "biology": 0.40},
    "bio-expert": {"algebra": 0.30, "history": 0.40, "biology": 0.95},
    "cheap": {"algebra": 0.25, "history": 0.90, "biology": 0.30},
}
COST = {"alg-expert": 1.0, "bio-expert": 1.0, "cheap": 0.1}


def make_rows(n: int, seed: int, *, with_answers: bool = True, twins: bool = False) -> tuple[list[str], list[dict]]:
    rng = np.random.default_rng(seed)
    models = list(ACCURACY)
    if twins:
        models += ["twin-a", "twin-b"]
    header = ["sample_id", "eval_name", "prompt", "answer", *models]
    header += [f"{m}|total_cost" for m in models]
    if with_answers:
        header += [f"{m}|answer" for m in models]
    rows = []
    topics = list(TOPICS)
    for i in range(n):
        topic = topics[rng.integers(len(topics))]
        words = list(rng.choice(TOPICS[topic], size=3)) + list(rng.choice(FILLER, size=5))
        rng.shuffle(words)
        options = "\n".join(f"{c}. option {c.lower()}{i}" for c in "ABCD")
        prompt = f"Question {i}: " + " ".join(words) + "?\n" + options
        ref = "ABCD"[rng.integers(4)]
        row = {"sample_id": f"q{i}", "eval_name": "synthetic", "prompt": prompt, "answer": ref}
        twin_right = rng.random() < 0.5
        twin_wrong = "ABCD"[("ABCD".index(ref) + 1) % 4]
        for m in models:
            if m.startswith("twin"):
                right = twin_right
                ans = ref if right else twin_wrong
            else:
                right = rng.random() < ACCURACY[m][topic]
                ans = ref if right else "ABCD"[("ABCD".index(ref) + 1 + rng.integers(3)) % 4]
            row[m] = "1" if right else "0"
            row[f"{m}|total_cost"] = str(COST.get(m, 0.5))
            if with_answers:
                row[f"{m}|answer"] = ans
        rows.append(row)
    return header, rows


def write_csv(path: Path, header: list[str], rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def topic_of(prompt: str) -> str:
    for topic, words in TOPICS.items():
        if any(w in prompt for w in words):
            return topic
    raise ValueError(prompt)
