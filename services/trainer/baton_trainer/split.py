"""Deterministic, grouped train/test split of an outcome CSV.

Rows are grouped by question (normalised prompt text), so a question repeated under several
sample ids lands on one side only; or, with ``--by eval_name``, by their evaluation (a subject, a
task), so that the test side holds whole subjects the training side never saw. Groups are ordered by a seeded hash and taken into the test
side until it holds ``test_share`` of the rows; the result depends only on the file's prompts,
the seed and the share, not on row order.

CLI: ``split --in X.csv --train A.csv --test B.csv [--test-share 0.3] [--seed 0] [--by question|eval_name]``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence

from baton_policy.matrix import group_key, read_rows


def split_indices(prompts: Sequence[str], test_share: float = 0.3, seed: int = 0,
                  groups_of: Sequence[str] | None = None) -> tuple[list[int], list[int]]:
    """Train and test row indices; rows with the same group (`groups_of[i]`, else the question) share a side."""
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test share must lie strictly between 0 and 1, got {test_share}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        groups[group_key(prompt) if groups_of is None else groups_of[i]].append(i)
    if groups_of is not None and len(groups) < 2:
        raise ValueError("splitting by group needs at least two groups")
    order = sorted(groups, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    target = test_share * len(prompts)
    test: list[int] = []
    for key in order:
        if len(test) >= target:
            break
        test.extend(groups[key])
    test_set = set(test)
    train = [i for i in range(len(prompts)) if i not in test_set]
    if groups_of is not None and not train:  # the last group taken was too large: give it back
        train, test = groups[key], [i for i in test if i not in set(groups[key])]
    return train, sorted(test)


def split_csv(src: str, train_path: str, test_path: str, test_share: float = 0.3, seed: int = 0,
              by: str = "question") -> dict:
    header, rows = read_rows(src)
    if by not in ("question", "eval_name"):
        raise ValueError(f"--by is question or eval_name, not {by!r}")
    groups = [r.get("eval_name") or "" for r in rows] if by == "eval_name" else None
    train, test = split_indices([r["prompt"] for r in rows], test_share, seed, groups)
    for path, idx in ((train_path, train), (test_path, test)):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows[i] for i in idx)
    return {"in": src, "train": train_path, "test": test_path, "train_rows": len(train), "test_rows": len(test),
            "test_share": test_share, "seed": seed, "by": by,
            "test_groups": sorted({rows[i].get("eval_name") or "" for i in test}) if by == "eval_name" else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="src", required=True, help="outcome CSV to split")
    parser.add_argument("--train", required=True, help="where to write the training rows")
    parser.add_argument("--test", required=True, help="where to write the test rows")
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--by", choices=("question", "eval_name"), default="question",
                        help="keep each question (default) or each evaluation, such as a subject, on one side")
    args = parser.parse_args(argv)
    print(json.dumps(split_csv(args.src, args.train, args.test, args.test_share, args.seed, args.by)))
    return 0
