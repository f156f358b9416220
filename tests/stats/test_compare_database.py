"""fleetflame compare's database forms: two versions (or two windows) of a service read from a
real store, one replicate per instance and bucket; a planted regression is found with its
size, and an A/A comparison finds nothing."""

import json

import numpy as np
import pytest

from collector.compare import main
from collector.store import SampleRow, Store

T0 = 1_700_000_000 // 86400 * 86400
STACKS = {
    "__main__:<module>;app:serve;app:render": 0.20,
    "__main__:<module>;app:serve;json:dumps": 0.30,
    "__main__:<module>;app:serve;db:query": 0.50,
}
RENDER = "app:render"
HOUR = ("--from", str(T0), "--to", str(T0 + 3600))  # the whole hour rows() writes


def rows(seed):
    """Six instances for an hour: three on 1.4.1, three on 1.4.2, where render's share is 5
    points higher; every instance's minutes wander around their shares (overdispersion)."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(6):
        version = "1.4.1" if index < 3 else "1.4.2"
        shares = dict(STACKS)
        if version == "1.4.2":
            shares["__main__:<module>;app:serve;app:render"] += 0.05
            shares["__main__:<module>;app:serve;db:query"] -= 0.05
        for minute in range(60):
            wander = rng.dirichlet([s * 300 for s in shares.values()])
            counts = rng.multinomial(1000, wander)
            for stack, count in zip(shares, counts, strict=True):
                out.append(
                    SampleRow(
                        T0 + 60 * minute,
                        "cpu",
                        "shop",
                        f"web-{index}",
                        f"i-{index}",
                        {"version": version},
                        stack,
                        int(count),
                        0.01,
                    )
                )
    return out


@pytest.fixture
def fleet(db_url):
    store = Store(db_url)
    store.migrate()
    store.write(rows(5))
    store.close()
    return db_url


def compare(capsys, fleet, a_label, b_label, *arguments):
    """Runs fleetflame compare on the shop service of ``fleet``; returns its status, out, err."""
    status = main(
        [
            "--database-url",
            fleet,
            "--service",
            "shop",
            "--a-label",
            a_label,
            "--b-label",
            b_label,
            *arguments,
        ]
    )
    out, err = capsys.readouterr()
    return status, out, err


def test_two_versions_the_regression_is_found_with_its_size(fleet, capsys):
    status, out, err = compare(capsys, fleet, "version:1.4.1", "version:1.4.2", *HOUR, "--json")
    assert status == 1, err
    doc = json.loads(out)
    assert doc["replicates"]["a"] == doc["replicates"]["b"] == 180  # 3 instances x 60 minutes
    (render,) = [f for f in doc["findings"] if f["function"] == RENDER and f["kind"] == "self"]
    # Within two standard errors (0.3 points each side here) of the planted 5 points.
    assert render["significant"] and render["change"] == pytest.approx(5.0, abs=0.8)
    assert render["ci_low"] < 5.0 < render["ci_high"]


def test_the_same_version_in_two_windows_finds_nothing(fleet, capsys):
    status, out, err = compare(
        capsys,
        fleet,
        "version:1.4.1",
        "version:1.4.1",
        "--a-from",
        str(T0),
        "--a-to",
        str(T0 + 1800),
        "--b-from",
        str(T0 + 1800),
        "--b-to",
        str(T0 + 3600),
        "--json",
    )
    assert status == 0, err
    assert not [f for f in json.loads(out)["findings"] if f["significant"]]


def test_relative_windows_are_read_as_the_documentation_writes_them(fleet, capsys):
    # docs/regressions.md: --a-from -2h ... argparse took -2h for an option (exit 2).
    for window in (["--from", "-1h", "--to", "now"], ["--a-from", "-2h", "--b-from", "-1h"]):
        status, _, err = compare(capsys, fleet, "version:1.4.1", "version:1.4.2", *window)
        assert "expected one argument" not in err
        assert status == 2 and "no samples of shop" in err  # the fleet is years ago: read


def test_a_sqlite_file_that_is_not_there_is_named_and_not_made(tmp_path, capsys):
    missing = tmp_path / "nope.db"
    url = f"sqlite:///{missing}"
    status = main(
        ["--database-url", url, "--service", "shop", "--a-label", "v:1", "--b-label", "v:2"]
    )
    assert status == 2 and f"no database at {missing}" in capsys.readouterr().err
    assert not missing.exists()  # opening it made an empty file before
    # A read-only URI of a file that is there is not taken for a missing one.
    there = tmp_path / "there.db"
    Store(f"sqlite:///{there}").migrate()
    uri = f"sqlite:///file:{there}?mode=ro&uri=true"
    status = main(
        ["--database-url", uri, "--service", "shop", "--a-label", "v:1", "--b-label", "v:2"]
    )
    assert status == 2 and "side A has no samples of shop" in capsys.readouterr().err


def test_an_empty_side_is_a_clear_error(fleet, capsys):
    status, _, err = compare(capsys, fleet, "version:0.9", "version:1.4.2", *HOUR)
    assert status == 2 and "side A has no samples of shop" in err


def test_a_sides_label_is_read_as_the_web_ui_reads_it(fleet, capsys):
    # The web UI reads a label exactly, with a key written as a JSON string where it holds
    # ':'; the command line stripped spaces and split at the first ':'.
    status, out, err = compare(capsys, fleet, '"version":1.4.1', "version:1.4.2", *HOUR, "--json")
    assert status == 1, err
    assert json.loads(out)["replicates"]["a"] == 180
    status, _, err = compare(capsys, fleet, "version: 1.4.1", "version:1.4.2", *HOUR)
    assert status == 2 and "side A has no samples" in err  # " 1.4.1" is no version here
