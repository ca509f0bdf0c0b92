"""The child side of IsolatedGrader: one JSON request per line on stdin, one JSON reply per line.

Replies go to a duplicate of the original stdout; anything a grader prints goes to stderr, so it
cannot be mistaken for a reply. Every failure becomes a reply: the parent decides what it means.
"""

from __future__ import annotations

import json
import os
import resource
import sys


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if memory_mb:
        try:
            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ValueError, OSError):
            pass  # a lower hard limit already holds
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from baton_graders import GradingError, grade

    for line in sys.stdin:
        try:
            request = json.loads(line)
            g = grade(request["grader"], request["answer"], request["reference"], **request.get("opts", {}))
            reply = {"score": g.score, "detail": g.detail}
        except (ValueError, TypeError) as e:
            reply = {"kind": "value", "message": f"{type(e).__name__}: {e}"[:1000]}
        except GradingError as e:
            reply = {"kind": "grading", "message": str(e)[:1000]}
        except BaseException as e:  # noqa: BLE001 - RecursionError, MemoryError, anything: report, keep serving
            reply = {"kind": "crash", "message": f"the grader raised {type(e).__name__}: {str(e)[:500]}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
