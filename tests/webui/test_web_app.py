"""Settings, authentication, pages, health, read-only URLs, the CLI and a missing database."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import webui
from webui.readonly import readonly_url
from webui.settings import SETTINGS, SettingsError, load_settings, markdown_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "overrides, said",
    [
        ({"DEFAULT_WINDOW": "yesterday"}, "default_window: 'yesterday' is not a time"),
        ({"DATABASE_URL": "mysql://a@b/c"}, "database_url: unsupported database 'mysql'"),
        ({"DATABASE_URL": "not a url"}, "database_url:"),
    ],
)
def test_settings_every_request_would_trip_on_are_refused_at_start(overrides, said):
    # They made every request without from= a 400, or every request a 500, once started.
    with pytest.raises(SettingsError, match=said):
        load_settings(environ={}, overrides=overrides)


def test_settings_layer_defaults_file_env_overrides(tmp_path):
    config = tmp_path / "web.toml"
    config.write_text('max_nodes = 700\ntitle = "from file"\nsample_interval = 1\n')
    env = {"FLEETFLAME_WEB_TITLE": "from env", "FLEETFLAME_WEB_CACHE_ENTRIES": "3"}
    values = load_settings(config, environ=env, overrides={"CACHE_ENTRIES": 9})
    assert values["MAX_NODES"] == 700 and values["TITLE"] == "from env"
    assert values["CACHE_ENTRIES"] == 9 and values["SAMPLE_INTERVAL"] == 1.0
    assert values["DATABASE_URL"] == "sqlite:///fleetflame.db"
    # The file may also come from FLEETFLAME_WEB_CONFIG (gunicorn 'webui:create_app()').
    assert load_settings(environ={"FLEETFLAME_WEB_CONFIG": str(config)})["MAX_NODES"] == 700


def test_one_file_for_collector_and_web(tmp_path):
    config = tmp_path / "fleetflame.toml"
    config.write_text(
        '[collector]\ndatabase_url = "sqlite:////srv/ff.db"\nbucket_seconds = 30\n'
        'targets = ["a:1"]\n\n[web]\nmax_nodes = 900\n'
    )
    values = load_settings(config, environ={})
    assert values["DATABASE_URL"] == "sqlite:////srv/ff.db" and values["BUCKET_SECONDS"] == 30
    assert values["MAX_NODES"] == 900


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("max_nodez = 5\n", {}, "unknown setting 'max_nodez'"),
        ('max_nodes = "many"\n', {}, "max_nodes"),
        ("max_nodes = [\n", {}, "not valid TOML"),
        ("", {"FLEETFLAME_WEB_MAX_NODES": "lots"}, "FLEETFLAME_WEB_MAX_NODES"),
        ("", {"FLEETFLAME_WEB_BUCKET_SECONDS": "0"}, "bucket_seconds"),
        ('auth_user = "ops"\n', {}, "auth_password"),
    ],
)
def test_bad_settings_say_which(tmp_path, text, env, message):
    config = tmp_path / "web.toml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(config, environ=env)


def test_missing_config_file():
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings("/nonexistent/web.toml", environ={})


def test_every_setting_is_documented():
    docs = (ROOT / "docs" / "webui.md").read_text()
    assert markdown_table() in docs, "regenerate the table: python -m webui.settings"
    for setting in SETTINGS:
        assert setting.env_var in docs


def test_readonly_urls(tmp_path):
    parsed = sa.engine.make_url(readonly_url(f"sqlite:///{tmp_path}/a b%.db"))
    assert parsed.database == f"file:{tmp_path}/a%20b%25.db"  # an SQLite URI, quoted
    assert parsed.query == {"mode": "ro", "uri": "true"}
    assert readonly_url("sqlite://") == "sqlite://"
    pg = readonly_url("postgresql+psycopg://u:p@h/db")
    assert "default_transaction_read_only" in pg and "u:p@" in pg


def test_a_missing_database_is_503_not_a_crash(tmp_path, make_app):
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/missing.db"})
    client = app.test_client()
    response = client.get("/api/flamegraph?from=-1h")
    assert response.status_code == 503
    assert "unavailable" in response.get_json()["error"]
    assert client.get("/healthz").status_code == 503
    assert not (tmp_path / "missing.db").exists()  # read-only: never created


def test_unreachable_postgresql_is_503(make_app):
    app = make_app({"DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none"})
    response = app.test_client().get("/api/timeline?from=-1h")
    assert response.status_code == 503 and "error" in response.get_json()


def test_the_open_health_check_names_no_database_host_or_user(make_app, caplog):
    app = make_app({"DATABASE_URL": "postgresql+psycopg://secretuser@127.0.0.9:1/secretdb"})
    response = app.test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_data(as_text=True)
    assert "unavailable" in body
    for secret in ("secretuser", "127.0.0.9", "secretdb"):
        assert secret not in body
    assert "127.0.0.9" in caplog.text  # the operator reads the cause in the log


def test_pages_are_served_with_a_strict_policy(client):
    for path in ("/", "/compare"):
        page = client.get(path)
        assert page.status_code == 200
        html = page.get_data(as_text=True)
        assert "vendor/d3.min.js" in html and "vendor/d3-flamegraph.min.js" in html
        csp = page.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("style-src")[0]
    assert client.get("/healthz").get_json() == {"status": "ok"}


def test_pages_preload_every_module_they_import(client):
    # Without preload links the browser finds each level of imports after the one before.
    js = Path(webui.__file__).parent / "static" / "js"
    ours = {path.name for path in js.glob("*.js")}
    for path, entry in (("/", "flamegraph.js"), ("/compare", "compare.js")):
        html = client.get(path).get_data(as_text=True)
        static = f"/static/{webui.asset_version()}"
        preloaded = set(re.findall(rf'rel="modulepreload" href="{static}/js/([\w-]+\.js)"', html))
        imported = {name for name in ours if f"from './{name}'" in (js / entry).read_text()}
        assert {"state.js", "util.js"} <= preloaded  # util.js only through state.js
        assert imported <= preloaded <= ours - {entry}
        for name in preloaded:
            with client.get(f"{static}/js/{name}") as response:
                assert response.status_code == 200, name


def test_the_flamegraph_page_names_its_graph_request_for_preloading(client):
    html = client.get("/?service=api&label=v:1&label=route:/x%20y&max_nodes=300&search=q").text
    links = re.findall(
        r'<link rel="preload" as="fetch" crossorigin="anonymous"\s+href="([^"]+)"', html
    )
    assert links == [
        "/api/flamegraph?from=-1h&amp;service=api&amp;label=v%3A1&amp;label=route%3A%2Fx+y"
        "&amp;max_nodes=300"
    ]
    # The URL's own window and mode; nothing the graph does not take (search, focus).
    html = client.get("/?from=-6h&to=now&mode=wall&focus=a;b").text
    assert 'href="/api/flamegraph?from=-6h&amp;to=now&amp;mode=wall"' in html
    assert 'rel="preload"' not in client.get("/compare").text


def test_static_assets_are_served_below_their_hash_and_kept_by_browsers(client):
    static = f"/static/{webui.asset_version()}"
    assert f'src="{static}/vendor/d3.min.js"' in client.get("/").text
    for name in ("vendor/d3.min.js", "vendor/d3-flamegraph.min.js", "js/flamegraph.js"):
        with client.get(f"{static}/{name}") as response:
            assert response.status_code == 200, name
            assert response.cache_control.max_age == webui.STATIC_MAX_AGE
            assert response.cache_control.immutable
        assert client.get(f"/static/{name}").status_code == 404  # no URL without the hash
    assert not client.get("/").cache_control.immutable


def test_the_asset_hash_changes_with_any_static_file(tmp_path, monkeypatch):
    (tmp_path / "js").mkdir()
    (tmp_path / "js" / "a.js").write_text("one")
    monkeypatch.setattr(webui, "STATIC", tmp_path)
    first = webui.asset_version()
    assert webui.asset_version() == first
    (tmp_path / "js" / "a.js").write_text("two")
    assert webui.asset_version() != first
    (tmp_path / "js" / "a.js").write_text("one")
    (tmp_path / "js" / "b.js").write_text("")
    second = webui.asset_version()
    assert second != first
    (tmp_path / "js" / ".b.js.tmp1234").write_text("half written")  # build_assets' temp file
    assert webui.asset_version() == second


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_bearer_token_auth(fleet_url, make_app):
    client = make_app({"DATABASE_URL": fleet_url, "AUTH_TOKEN": "s3cret"}).test_client()
    denied = client.get("/api/labels?from=-1h")
    assert denied.status_code == 401 and "Basic" in denied.headers["WWW-Authenticate"]
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/", headers=basic("anyone", "s3cret")).status_code == 200
    assert client.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
    assert client.get("/healthz").status_code == 200  # load balancers need no token


def test_basic_auth(fleet_url, make_app):
    app = make_app({"DATABASE_URL": fleet_url, "AUTH_USER": "ops", "AUTH_PASSWORD": "pw"})
    client = app.test_client()
    assert client.get("/compare").status_code == 401
    assert client.get("/compare", headers=basic("ops", "pw")).status_code == 200
    assert client.get("/compare", headers=basic("ops", "nope")).status_code == 401
    assert client.get("/compare", headers=basic("root", "pw")).status_code == 401


def test_no_debug_mode(fleet_url, monkeypatch, make_app):
    monkeypatch.setenv("FLASK_DEBUG", "1")
    app = make_app({"DATABASE_URL": fleet_url})
    assert app.debug is False
    response = app.test_client().get("/api/top?from=nonsense")
    assert response.status_code == 400 and "Traceback" not in response.get_data(as_text=True)


def test_cli_help_and_bad_config(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "webui", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--max-nodes" in out.stdout and "gunicorn" in out.stdout
    from webui.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("nope = 1\n")
    assert main(["--config", str(bad)]) == 2


def test_caches_reuse_settled_windows_only(fleet_url):
    from webhelpers import T0

    from webui.db import Database

    now = [T0 + 3600 + 30]  # the hour's window is still receiving samples
    database = Database(fleet_url, cache_entries=2, clock=lambda: now[0])
    try:
        check_caches(database, now)
    finally:
        database.close()


def check_caches(database, now):
    from webhelpers import T0

    from webui.params import Selection

    reads = []
    real = database.query.stack_counts
    database.query.stack_counts = lambda *a, **k: reads.append(a) or real(*a, **k)
    hour = Selection(T0, T0 + 3600)
    database.profile(hour)
    database.profile(hour)
    assert len(reads) == 1  # the page's requests share one read
    now[0] += 60
    database.profile(hour)
    assert len(reads) == 2  # stale: the window may have grown
    calls = []
    assert database.cached("k", database.settled(hour), lambda: calls.append(1) or 1) == 1
    assert database.cached("k", database.settled(hour), lambda: calls.append(1) or 1) == 1
    assert len(calls) == 2  # not settled: computed every time
    now[0] += 3600
    assert database.settled(hour)
    database.profile(hour)  # settled since: the last read is still right
    assert len(reads) == 2
    database.profile(Selection(T0, T0 + 60))
    database.profile(hour)
    assert len(reads) == 4
    for key in ("a", "b", "a", "c", "a"):
        database.cached(key, True, lambda key=key: calls.append(key) or key)
    assert calls[2:] == ["a", "b", "c"]  # LRU of two: "a" stayed, "b" was evicted by "c"


def test_build_assets_copies_the_npm_files(tmp_path):
    from webui.build_assets import ASSETS, AssetError, build_assets

    written = build_assets(ROOT, tmp_path / "vendor", install=False)
    assert sorted(p.name for p in written) == sorted(name for _, name in ASSETS)
    assert {p.stat().st_mode & 0o777 for p in written} == {0o644}  # readable by the server
    assert sorted(p.name for p in (tmp_path / "vendor").iterdir()) == sorted(
        p.name for p in written
    )
    bundle = (tmp_path / "vendor" / "d3-flamegraph.min.js").read_text()
    # 5.x's UMD bundle exports a namespace with `default`: webui/static/js/flame.js handles it.
    assert "default" in bundle
    with pytest.raises(AssetError, match="npm ci"):
        build_assets(tmp_path, tmp_path / "other", install=False)


def test_gc_pauses_nest_end_on_errors_and_never_last_long(monkeypatch):
    import gc

    from webui import gcpause

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gcpause.paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("a failed request")
    assert gc.isenabled()
    outer = gcpause.paused_gc()
    outer.__enter__()
    with gcpause.paused_gc():
        pass
    assert not gc.isenabled()  # the outer request still reads
    outer.__exit__(None, None, None)
    assert gc.isenabled()
    # Overlapping requests under steady load: past the longest pause, collection resumes.
    monkeypatch.setattr(gcpause, "_GC_MAX_PAUSE", 0.0)
    outer = gcpause.paused_gc()
    outer.__enter__()
    with gcpause.paused_gc():
        pass
    assert gc.isenabled()
    outer.__exit__(None, None, None)
    assert gc.isenabled()
    # A host that turned the collector off keeps it off.
    gc.disable()
    try:
        with gcpause.paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_app_starts_without_numpy_or_scipy(tmp_path):
    # They took ~0.55 s and ~70 MB of every web process (and gunicorn worker) to import; only
    # a comparison's statistics and a function's change points need them, when first asked.
    code = (
        "import sys; from webui import create_app; "
        f"app = create_app({{'DATABASE_URL': 'sqlite:///{tmp_path / 'x.db'}'}}); "
        "print(sorted(m for m in ('numpy', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr
