"""docs/operations.md: every file it names exists, and its read-only database role works."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from collector.query import Query
from collector.store import SampleRow, Store, StoreError

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operations.md").read_text()
T0 = 1_795_420_800


def test_every_repository_path_in_the_runbook_exists() -> None:
    paths = set(re.findall(r"`((?:deploy|docs|collector)/[\w./-]+)`", DOC))
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert missing == []


def test_the_sizing_figures_come_from_the_benchmarks() -> None:
    section = DOC.split("## 3. Sizing")[1].split("## 4.")[0]
    figures = section.split("| figure |")[1].split("\n\n")[0]  # the measured figures' table
    rows = [line for line in figures.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 5 and "TODO" not in section and "@" not in figures
    for line in rows:  # every figure says which benchmark measured it
        assert re.search(r"`python bench/bench_\w+\.py[^`]*`", line), line
    # The sizing table by fleet size goes to 10,000 workers.
    assert "| 10,000 |" in section.split("### Sizing by fleet")[1]


def _role_sql(role: str, owner: str, database: str) -> list[str]:
    block = DOC.split("```sql")[1].split("```")[0]
    block = (
        block.replace("fleetflame_web", role)
        .replace("FOR ROLE fleetflame", f'FOR ROLE "{owner}"')
        .replace("DATABASE fleetflame", f'DATABASE "{database}"')
    )
    return [s.strip() for s in block.split(";") if s.strip()]


def test_the_read_only_role_can_query_but_not_write(pg_url) -> None:
    owner_store = Store(pg_url)
    owner_store.migrate()
    owner_store.write([SampleRow(T0, "cpu", "api", "h", "i", {}, "a;b", 3)])
    url = sa.engine.make_url(pg_url)
    role = f"fleetflame_web_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    reader_store = None
    try:
        with admin.connect() as conn:
            for statement in _role_sql(role, url.username, url.database):
                conn.execute(sa.text(statement))
        reader_url = url.set(username=role, password="change-me")
        reader_store = Store(reader_url.render_as_string(hide_password=False))
        assert Query(reader_store).profile(T0, T0 + 60) == {"a;b": 3}
        # A partition the collector creates later (a new day) is readable too.
        later = T0 + 40 * 86400
        owner_store.write([SampleRow(later, "cpu", "api", "h", "i", {}, "a;c", 5)])
        assert Query(reader_store).profile(later, later + 60) == {"a;c": 5}
        with pytest.raises(StoreError, match="permission denied"):
            reader_store.write([SampleRow(later, "cpu", "api", "h", "i", {}, "x", 1)])
    finally:
        if reader_store is not None:
            reader_store.close()
        owner_store.close()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()
