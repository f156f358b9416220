"""systemd units, the Dockerfile, docker-compose.yml and the uWSGI configs, checked without running
them where this machine cannot (no Docker engine, no systemd as PID 1)."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from collector import settings as collector_settings
from webui import settings as web_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
VENV_BIN = Path(sys.executable).parent
COLLECTOR_ENV = {s.env_var for s in collector_settings.SETTINGS}
WEB_ENV = {s.env_var for s in web_settings.SETTINGS} | {web_settings.CONFIG_ENV}


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    # Continuation lines end in a backslash: join them as systemd does.
    parser.read_string(re.sub(r"\\\n\s*", " ", path.read_text()))
    return parser


def test_units_exist_for_the_collector_and_the_web_ui() -> None:
    assert [u.name for u in UNITS] == ["fleetflame-collector.service", "fleetflame-web.service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_structure_and_commands(unit) -> None:
    parser = _unit(unit)
    assert parser.sections() == ["Unit", "Service", "Install"]
    service = parser["Service"]
    assert service["Restart"] == "on-failure"
    assert service["DynamicUser"] == "yes" and service["NoNewPrivileges"] == "yes"
    argv = shlex.split(service["ExecStart"])
    assert argv[0].startswith("/opt/fleetflame/venv/bin/")
    executable = VENV_BIN / Path(argv[0]).name  # the same console script, installed here
    assert executable.is_file(), argv[0]
    if "collector" in unit.name:
        assert argv[1:3] == ["collect", "--config"]
        help_run = subprocess.run(
            [str(executable), *argv[1:2], "--help"], capture_output=True, text=True, timeout=60
        )
        assert help_run.returncode == 0 and "--config" in help_run.stdout
    else:
        assert argv[-1] == "webui:create_app()"  # gunicorn's app factory syntax
        assert "--bind" in argv and argv[argv.index("--bind") + 1].startswith("127.0.0.1:")
        env = dict(item.split("=", 1) for item in shlex.split(service["Environment"]))
        assert set(env) <= WEB_ENV


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify(unit, tmp_path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's virtualenv.
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace("/opt/fleetflame/venv/bin/", f"{VENV_BIN}/"))
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        # Units it pulls in that this container does not have are not our unit's problem.
        if line.strip() and "postgresql.service" not in line and "network-online" not in line
    ]
    assert out.returncode == 0 and problems == [], out.stdout + out.stderr


def _dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "docker" / "Dockerfile").read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_copies_files_that_exist_and_runs_as_a_user() -> None:
    instructions = _dockerfile()
    froms = [rest for kw, rest in instructions if kw == "FROM"]
    assert len(froms) == 2 and all(":" in image.split()[0] for image in froms)  # pinned tags
    stages = {image.split()[-1] for image in froms if " AS " in image}
    for keyword, rest in instructions:
        if keyword != "COPY":
            continue
        parts = rest.split()
        if parts[0].startswith("--from="):
            assert parts[0].split("=", 1)[1] in stages
            continue
        for source in parts[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: not in the build context"
    users = [rest for kw, rest in instructions if kw == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any(kw == "HEALTHCHECK" for kw, _ in instructions)
    cmd = yaml.safe_load([rest for kw, rest in instructions if kw == "CMD"][-1])
    assert cmd[0] == "fleetflame" and cmd[1] == "collect"
    assert "fleetflame = sampler.cli:main" in (REPO / "setup.py").read_text()


def test_the_image_builds_every_package_the_wheel_holds() -> None:
    # The wheel lists the attach agent's package; the image copied only three, so
    # `fleetflame attach` failed in it with ModuleNotFoundError.
    setup = (REPO / "setup.py").read_text()
    listed = re.search(r"find_namespace_packages\(\s*include=\[(.*?)\]", setup, re.S)
    assert listed
    packages = {name for name in re.findall(r'"([a-z_]+)"', listed.group(1))}
    copied = {rest.split()[0] for kw, rest in _dockerfile() if kw == "COPY"}
    assert packages == {"sampler", "collector", "webui", "attach"}
    assert packages <= copied, packages - copied
    installs = " ".join(rest for kw, rest in _dockerfile() if kw == "RUN")
    assert "py-spy" in installs  # what the attach agent runs


def test_the_build_context_excludes_local_state() -> None:
    ignore = (REPO / ".dockerignore").read_text().split()
    for entry in (".venv", "node_modules", "var", ".git"):
        assert entry in ignore


def test_compose_file_is_consistent() -> None:
    compose_dir = DEPLOY / "docker"
    compose = yaml.safe_load((compose_dir / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "collector", "web"}
    pg_env = services["postgres"]["environment"]
    for name in ("collector", "web"):
        service = services[name]
        build = service["build"]
        assert (compose_dir / build["context"] / build["dockerfile"]).is_file()
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), port  # nothing published beyond the host
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            # A path on the host, or a named volume the file declares.
            assert (compose_dir / host).exists() or host in compose["volumes"], volume
        for dependency in service.get("depends_on", {}):
            assert dependency in services
        known = COLLECTOR_ENV if name == "collector" else WEB_ENV
        for key, value in service["environment"].items():
            assert key in known or key == "FLEETFLAME_HEALTHCHECK_URL", key
            if key.endswith("DATABASE_URL"):
                # The URL names the postgres service with its user and database.
                assert "@postgres:5432/" + pg_env["POSTGRES_DB"] in value
                assert value.startswith(f"postgresql+psycopg://{pg_env['POSTGRES_USER']}:")
    assert services["collector"]["command"][:2] == ["fleetflame", "collect"]
    assert services["web"]["command"][-1] == "webui:create_app()"
    assert "pgdata" in compose["volumes"]


def test_compose_configs_load_with_the_real_settings_loaders() -> None:
    collector = collector_settings.load_settings(
        str(DEPLOY / "docker" / "collector.toml"), environ={}
    )
    assert collector.target_files == ["/etc/fleetflame/targets/*.json"]
    web = web_settings.load_settings(str(DEPLOY / "docker" / "webui.toml"), environ={})
    assert web["TITLE"] == "fleetflame"
    from collector.targets import read_discovery_file

    targets = read_discovery_file(str(DEPLOY / "docker" / "targets" / "workers.json"))
    assert len(targets) == 16 and targets[0].address == "host.docker.internal:8021"


@pytest.mark.parametrize("name", ["uwsgi.ini", "uwsgi-lazy-apps.ini"])
def test_uwsgi_configs_have_the_options_the_sampler_needs(name) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(DEPLOY / "uwsgi" / name)
    options = parser["uwsgi"]
    assert options["enable-threads"] == "true"  # the sampler's endpoint is a thread
    assert options["master"] == "true"
    if name == "uwsgi.ini":
        assert options["import"] == "fleetflame_uwsgi"
        assert (DEPLOY / "uwsgi" / "fleetflame_uwsgi.py").is_file()
        assert options["py-call-osafterfork"] == "true"
    else:
        assert options["lazy-apps"] == "true"
