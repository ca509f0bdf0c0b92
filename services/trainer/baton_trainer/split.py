"""Deterministic, grouped train/test split of an outcome CSV.

Rows are grouped by question (normalised prompt text), so a question repeated under several
sample ids lands on one side only. Groups are ordered by a seeded hash and taken into the test
side until it holds ``test_share`` of the rows; the result depends only on the file's prompts,
the seed and the share, not on row order.

CLI: ``split --in X.csv --train A.csv --test B.csv [--test-share 0.3] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence

from baton_policy.matrix import group_key, read_rows


def split_indices(prompts: Sequence[str], test_share: float = 0.3, seed: int = 0) -> tuple[list[int], list[int]]:
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test share must lie strictly between 0 and 1, got {test_share}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        groups[group_key(prompt)].append(i)
    order = sorted(groups, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    target = test_share * len(prompts)
    test: list[int] = []
    for key in order:
        if len(test) >= target:
            break
        test.extend(groups[key])
    test_set = set(test)
    train = [i for i in range(len(prompts)) if i not in test_set]
    return train, sorted(test)


def split_csv(src: str, train_path: str, test_path: str, test_share: float = 0.3, seed: int = 0) -> dict:
    header, rows = read_rows(src)
    train, test = split_indices([r["prompt"] for r in rows], test_share, seed)
    for path, idx in ((train_path, train), (test_path, test)):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows[i] for i in idx)
    return {"in": src, "train": train_path, "test": test_path, "train_rows": len(train), "test_rows": len(test),
            "test_share": test_share, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="src", required=True, help="outcome CSV to split")
    parser.add_argument("--train", required=True, help="where to write the training rows")
    parser.add_argument("--test", required=True, help="where to write the test rows")
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(split_csv(args.src, args.train, args.test, args.test_share, args.seed)))
    return 0
