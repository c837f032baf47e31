"""The systemd units of ``deploy/`` (docs/deploy.md): ``systemd-analyze verify`` accepts every
one, and each unit's ``ExecStart`` names a real entry point - with the variables of its
environment files expanded as systemd would, the command's ``--help`` exits 0, its whole
command line parses, and the ``MODULE:CLASS`` it runs imports as a Master or Worker.

The units name the install paths of the deployment (``/opt/framework/current``,
``/etc/framework``); the test renders them onto this checkout and its venv first."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from framework.cli import build_parser
from framework.runtime.launch.runner import load_class

if shutil.which("systemd-analyze") is None:
    pytest.skip("systemd-analyze is not installed (apt-get install systemd): deploy/ units "
                "not verified", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
#: The instance a template unit is checked as (deploy/env/app-crawler.env exists).
INSTANCE = "crawler"
#: Every kind of process docs/deploy.md deploys, by its unit.
KINDS = {"framework-worker@.service", "framework-master@.service", "broker-server.service",
         "broker-controller.service", "katta-node.service", "katta-master.service",
         "framework-dashboard.service"}


def render(text: str, env_dir: Path) -> str:
    """A unit's text with the deployment's paths replaced by this checkout's."""
    return (text.replace("/opt/framework/current/venv", sys.prefix)
            .replace("/opt/framework/current/src", str(ROOT))
            .replace("/etc/framework/", f"{env_dir}/"))


def settings(unit: Path) -> list[tuple[str, str]]:
    """The ``[Service]`` section's ``(key, value)`` lines, in order."""
    found, section = [], ""
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.append((key.strip(), value.strip()))
    return found


def read_env_file(path: Path) -> dict[str, str]:
    """systemd's ``EnvironmentFile=`` syntax: ``NAME=value`` lines, ``#`` comments,
    a value in double quotes taken without them."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{path.name}: {line!r}"
        env[name] = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return env


def exec_start(unit: Path) -> list[str]:
    """The unit's ``ExecStart`` as systemd would run it (as instance :data:`INSTANCE`):
    specifiers replaced, ``${NAME}`` one word, ``$NAME`` split on white space."""
    specifiers = {"%i": INSTANCE, "%l": "host1", "%H": "host1.example", "%%": "%"}
    env: dict[str, str] = {}
    command = ""
    for key, value in settings(unit):
        for spec, text in specifiers.items():
            value = value.replace(spec, text)
        if key == "Environment":
            name, _, text = value.partition("=")
            env[name] = text
        elif key == "EnvironmentFile":
            path = DEPLOY / "env" / Path(value).name
            assert path.is_file(), f"{unit.name}: no {path.relative_to(ROOT)}"
            env.update(read_env_file(path))
        elif key == "ExecStart":
            command = value
    assert command, f"{unit.name} has no ExecStart"
    argv: list[str] = []
    for word in shlex.split(command):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        split = re.fullmatch(r"\$(\w+)", word)
        if whole:
            assert whole.group(1) in env, f"{unit.name}: {word} is set nowhere"
            argv.append(env[whole.group(1)])
        elif split:
            assert split.group(1) in env, f"{unit.name}: {word} is set nowhere"
            argv.extend(env[split.group(1)].split())
        else:
            argv.append(word)
    return argv


def test_a_unit_per_kind_of_process() -> None:
    assert {u.name for u in UNITS} == KINDS


def test_systemd_analyze_verifies_every_unit(tmp_path: Path) -> None:
    env_dir = tmp_path / "etc"
    shutil.copytree(DEPLOY / "env", env_dir)
    rendered = []
    for unit in UNITS:
        target = tmp_path / unit.name
        target.write_text(render(unit.read_text(), env_dir))
        rendered.append(str(target))
    done = subprocess.run(["systemd-analyze", "verify", *rendered], capture_output=True,
                          text=True, cwd=tmp_path)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not output, output


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_exec_start_names_a_real_entry_point(unit: Path) -> None:
    argv = exec_start(unit)
    program = Path(render(argv[0], DEPLOY / "env"))
    assert argv[0].startswith("/opt/framework/current/venv/bin/"), argv[0]
    assert program.is_file(), program
    command = argv[1]
    done = subprocess.run([str(program), command, "--help"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    parsed = build_parser().parse_args(argv[1:])  # every flag of the unit is one
    if command == "run":
        load_class(parsed.component)  # a Master or Worker subclass, or a one-line error
