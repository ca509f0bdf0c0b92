"""``python -m baton_trainer replay ...`` / ``python -m baton_trainer split ...``."""

from __future__ import annotations

import sys

from . import replay, split

COMMANDS = {"replay": replay.main, "split": split.main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m baton_trainer {{{'|'.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
