"""Two adjacent minutes compared (issue 14, item 4): a regression that starts at a minute's
edge is shown when the windows are whole minutes, and when they are typed off the edges the
answer says which buckets were read, so the user sees why it vanished."""

from webhelpers import T0, client_over

from collector.store import SampleRow

EDGE = T0 + 600  # the deploy: app:render's share is 10% before, 30% from this minute on


def rows():
    out = []
    for minute in range(20):
        bucket = T0 + 60 * minute
        render = 30 if bucket >= EDGE else 10
        for stack, count in (("main;app:render", render), ("main;json:dumps", 100 - render)):
            out.append(SampleRow(bucket, "cpu", "api", "h", "i", {}, stack, count))
    return out


def render_change(data):
    (change,) = [f for f in data["functions"] if f["name"] == "app:render"]
    return change["self_delta"]


def test_adjacent_minutes_show_the_regression_and_the_buckets_they_read(tmp_path):
    with client_over(tmp_path / "f.db", rows()) as client:
        whole = {"a_from": EDGE - 60, "a_to": EDGE, "b_from": EDGE, "b_to": EDGE + 60}
        data = client.get("/api/diff", query_string=whole).json
        assert abs(render_change(data) - 0.2) < 1e-9
        assert (data["a"]["read_from"], data["a"]["read_to"]) == (EDGE - 60, EDGE)
        assert (data["b"]["read_from"], data["b"]["read_to"]) == (EDGE, EDGE + 60)
        # Typed 30 s late, side A holds the bucket that starts in it: the deploy's minute.
        # The regression vanishes, and the answer says both sides read regressed minutes.
        late = {k: v + 30 for k, v in whole.items()}
        data = client.get("/api/diff", query_string=late).json
        assert render_change(data) == 0
        assert (data["a"]["read_from"], data["a"]["read_to"]) == (EDGE, EDGE + 60)
        assert (data["b"]["read_from"], data["b"]["read_to"]) == (EDGE + 60, EDGE + 120)
