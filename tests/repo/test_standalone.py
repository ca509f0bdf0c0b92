"""The repository stands alone: no tracked file reads or names a path outside it.

A user clones Baton by itself, so a config, script, test or document that points beside the
checkout (``../something``, ``REPO.parent / ...``, an absolute path of one machine) works only
where that neighbour happens to exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from testbed import REPO

# `../x` or `../../x/y`: a relative path that climbs, with at least one named part after it.
CLIMBING = re.compile(r"(?<![\w.])((?:\.\./)+)([\w][\w.-]*)")
# Python that builds a path beside the repository.
PARENT_JOIN = re.compile(r"\.parent\s*/\s*['\"]")
# Absolute paths of a developer's or CI's machine.
MACHINE_PATHS = re.compile(r"(?<![\w.])/(?:work|home|Users)/\w")
SKIP_SUFFIXES = {".csv", ".lock", ".png", ".parquet", ".gguf", ".pb", ".ico"}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def escapes(file: Path, line: str) -> list[str]:
    """The paths on one line of ``file`` that lead outside the repository."""
    found = []
    for m in CLIMBING.finditer(line):
        target = m.group(1) + m.group(2)
        # Relative to the file (configs, docs, imports) and to the repository root (commands in
        # a README or Makefile run there): outside the repository both ways is outside.
        if all(not (base / target).resolve().is_relative_to(REPO) for base in (file.parent, REPO)):
            found.append(target)
    found += [m.group(0) for m in PARENT_JOIN.finditer(line) if "REPO" in line and ".parent" in line
              and "parents[" not in line]
    found += [m.group(0) for m in MACHINE_PATHS.finditer(line)]
    return found


def test_no_tracked_file_names_a_path_outside_the_repository():
    problems = []
    for file in tracked_files():
        # This file names escapes on purpose, to show the check finds them.
        if file.suffix in SKIP_SUFFIXES or not file.is_file() or file == Path(__file__).resolve():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for target in escapes(file, line):
                problems.append(f"{file.relative_to(REPO)}:{n}: {target}")
    assert not problems, "paths outside the repository:\n" + "\n".join(problems)


def test_the_check_finds_each_kind_of_escape():
    config = REPO / "config" / "baton.yaml"
    assert escapes(config, "dataset: ../../beside/data/routing/x.csv") == ["../../beside"]
    assert escapes(config, "dataset: ../data/routing/x.csv") == []
    assert escapes(REPO / "tests" / "t.py", 'DATA = REPO.parent / "beside" / "data"')
    assert escapes(REPO / "README.md", "python -m x --in /work/beside/data/x.csv")
    assert not escapes(REPO / "README.md", "see docs/x.md and https://example.org/work/")


def test_the_routing_data_ships_with_its_license():
    data = REPO / "data" / "routing"
    for name in ("mmlu_pro_dev.csv", "routellm_mmlu.csv", "routellm_gsm8k.csv"):
        assert (data / name).stat().st_size > 100_000, name
        assert f"`{name}`" in (data / "README.md").read_text()
    assert "Apache License" in (data / "LICENSE.routellm-apache-2.0").read_text()
