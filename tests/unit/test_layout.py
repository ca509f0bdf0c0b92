"""The import rules that keep the layers apart: libraries never import services or the tools
application, services never import each other or the tools. Checked on the source, so a new import
fails here before it couples two images."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {p.name: next(p.glob("baton_*")).name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists()}
LIBS = [p for p in (ROOT / "libs").iterdir() if (p / "pyproject.toml").exists()]
TOOLS = "baton_tools"


def imported_packages(package_dir: Path) -> dict[str, set[str]]:
    """Top-level package names each module under `package_dir` imports, by module path."""
    out: dict[str, set[str]] = {}
    for path in package_dir.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[f"{package_dir.name}/{path.relative_to(package_dir)}"] = names
    return out


def violations(package_dir: Path, forbidden: set[str]) -> list[str]:
    return [f"{mod} imports {name}" for mod, names in imported_packages(package_dir).items()
            for name in sorted(names & forbidden)]


def test_libraries_import_no_service_and_not_the_tools():
    forbidden = set(SERVICES.values()) | {TOOLS}
    found = [v for lib in LIBS for v in violations(lib, forbidden)]
    assert found == []


def test_services_import_no_other_service_and_not_the_tools():
    found = []
    for folder, package in SERVICES.items():
        forbidden = (set(SERVICES.values()) - {package}) | {TOOLS}
        found += violations(ROOT / "services" / folder, forbidden)
    assert found == []


def test_the_check_sees_a_forbidden_import(tmp_path):
    (tmp_path / "m.py").write_text("import os\nfrom baton_router.planning import Planner\n")
    assert [v.split(" imports ")[1] for v in violations(tmp_path, set(SERVICES.values()))] == ["baton_router"]


def test_every_package_is_found():
    assert {"baton_gateway", "baton_router", "baton_trainer"} <= set(SERVICES.values())
    assert {"platform", "workflow", "policy"} <= {lib.name for lib in LIBS}
