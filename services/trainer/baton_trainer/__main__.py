"""``baton-trainer {split|train-fast|rollback|launch-grpo|grpo|warm-start|publish-lora} ...`` (also ``python -m baton_trainer``).

Offline evaluation (replay, held-out subjects, the conductor table) is ``baton eval``'s, in baton_eval.
"""

from __future__ import annotations

import sys

from . import publish_lora, split, train_fast


def _launch(argv: list[str]) -> int:
    from . import cluster

    return cluster.main(argv)


def _grpo(argv: list[str]) -> int:
    # Imported on use: GRPO needs torch, TRL and the router's prompt code (the `grpo` extra), which the
    # other commands do without.
    from . import grpo

    return grpo.main(argv)


def _warm_start(argv: list[str]) -> int:
    from . import warmstart  # torch and peft load only for this command

    return warmstart.main(argv)


COMMANDS = {
    "split": split.main,
    "train-fast": lambda argv: train_fast.main(argv, "train-fast"),
    "rollback": lambda argv: train_fast.main(argv, "rollback"),
    "launch-grpo": lambda argv: _launch(argv),
    "grpo": _grpo,
    "warm-start": _warm_start,
    "publish-lora": publish_lora.main,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m baton_trainer {{{'|'.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
