"""The settings tables in the docs are the declarations, rendered (docs/settings_tables.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool():
    spec = importlib.util.spec_from_file_location(
        "settings_tables", ROOT / "docs/settings_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("doc", ["sampler.md", "collector.md", "webui.md"])
def test_each_docs_table_is_its_settings_rendered(doc):
    tables = tool().tables()
    path = ROOT / "docs" / doc
    table = tables[path]
    assert table in path.read_text(), f"run: python docs/settings_tables.py ({doc} is stale)"


def test_every_setting_of_every_program_is_one_row():
    from collector.settings import SETTINGS as COLLECTOR
    from sampler import SETTINGS as SAMPLER
    from webui.settings import SETTINGS as WEB

    tables = tool().tables()
    for settings, doc in ((SAMPLER, "sampler.md"), (COLLECTOR, "collector.md"), (WEB, "webui.md")):
        rows = tables[ROOT / "docs" / doc].splitlines()[2:]
        assert [row.split(" | ")[0] for row in rows] == [f"| `{s.name}`" for s in settings]
        assert all(
            s.env_var and f"`{s.env_var}`" in row for s, row in zip(settings, rows, strict=True)
        )


def test_the_tool_replaces_only_the_table():
    text = "# Title\n\nintro\n\n| a | b |\n| --- | --- |\n| old | row |\n\nafter\n"
    new = tool().with_table(text, "| a | b |\n| --- | --- |\n| new | row |\n")
    assert new == "# Title\n\nintro\n\n| a | b |\n| --- | --- |\n| new | row |\n\nafter\n"
    with pytest.raises(ValueError, match="one table"):
        tool().with_table("no table", "| a | b |\n")
