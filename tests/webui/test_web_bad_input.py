"""Bad input answers a clear error (issue 14, defects 9 and 13): times no store can hold are a
400 naming the parameter on every endpoint (they were 500s: a float overflow, a negative varint
in pprof); a missing SQLite file is named."""

import sqlite3
from contextlib import closing

import pytest

ENDPOINTS = ["/api/flamegraph", "/api/top", "/api/pprof", "/api/speedscope", "/api/folded"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("value", ["9" * 309, "0001-01-01T00:00:00Z"])
def test_a_time_out_of_range_is_a_400_naming_it(client, endpoint, value):
    answer = client.get(endpoint, query_string={"from": value})
    assert answer.status_code == 400, answer.data[:300]
    assert answer.json["param"] == "from"
    assert "out of range" in answer.json["error"]


def test_a_missing_sqlite_file_is_named_in_the_error(make_app, tmp_path):
    missing = tmp_path / "nowhere" / "fleetflame.db"
    app = make_app({"DATABASE_URL": f"sqlite:///{missing}"})
    answer = app.test_client().get("/api/flamegraph")
    assert answer.status_code == 503
    assert str(missing) in answer.json["error"] and "collector" in answer.json["error"]


def _empty_database(path):
    path.touch()


def _another_database(path):
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (text)")


@pytest.mark.parametrize(
    "make, says",
    [
        (_empty_database, "holds no fleetflame data"),
        (_another_database, "holds no fleetflame data"),
        (lambda path: path.write_bytes(bytes(range(256)) * 20), "is not a SQLite database"),
        (lambda path: path.mkdir(), "is not a file"),
    ],
)
def test_a_file_that_is_not_the_collectors_database_is_named_in_the_error(
    make_app, tmp_path, make, says
):
    # Not "try again shortly (attempt to write a readonly database)": nothing will change.
    path = tmp_path / "fleetflame.db"
    make(path)
    app = make_app({"DATABASE_URL": f"sqlite:///{path}"})
    for endpoint in ("/api/flamegraph", "/api/top", "/api/labels"):
        answer = app.test_client().get(endpoint)
        assert answer.status_code == 503, answer.data[:300]
        assert str(path) in answer.json["error"] and says in answer.json["error"], answer.json
        assert "try again" not in answer.json["error"]


@pytest.mark.parametrize("label", [":1.4.2", "version", '"":1.4.2'])
def test_a_label_filter_needs_a_key_and_a_value(client, label):
    # (A value may be empty, or spaces: "version:" asks for the empty value, as stored.)
    answer = client.get("/api/flamegraph", query_string={"label": label})
    assert answer.status_code == 400
    assert answer.json["param"] == "label" and "key:value" in answer.json["error"]


def test_a_locked_database_is_not_called_another_kind_of_file(tmp_path):
    # A lock (a writer mid-transaction) is an outage to wait out, not a wrong file.
    from webui.readonly import sqlite_file_problem

    path = tmp_path / "fleetflame.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.commit()
    assert sqlite_file_problem(f"sqlite:///{path}") is None
    with closing(sqlite3.connect(path, isolation_level=None)) as writer:
        writer.execute("BEGIN EXCLUSIVE")
        assert sqlite_file_problem(f"sqlite:///{path}") is None
        writer.execute("ROLLBACK")


def test_a_bucket_width_the_database_does_not_hold_is_an_error_not_part_of_the_data(
    make_app, tmp_path
):
    from collector.store import Store

    url = f"sqlite:///{tmp_path / 'fleetflame.db'}"
    with Store(url) as store:
        store.migrate()
    app = make_app({"DATABASE_URL": url, "BUCKET_SECONDS": 120})
    answer = app.test_client().get("/api/flamegraph?from=-1h")
    assert answer.status_code == 500
    assert "holds 60-second buckets, and bucket_seconds is 120" in answer.json["error"]
