"""The Firefox Profiler (Gecko) export: every sample there, each stack rebuilt from its prefix
chain, at the sampler's real interval (issue 14: units from the interval, not 100 Hz)."""

import json

import pytest
from webhelpers import T0

from sampler.profile import split_frames, unescape_frame
from webui.exports import EXPORTS, ExportInfo
from webui.exports.gecko import gecko_document

COUNTS = {
    "__main__:<module>;app:serve;app:render": 30,
    "__main__:<module>;app:serve;json:dumps": 12,
    "__main__:<module>;app:serve;m:semi%3Bcolon:42": 1,
}


def rebuilt(document):
    """The folded counts the document's samples stand for (names as people read them)."""
    (thread,) = document["threads"]
    strings, frames = thread["stringTable"], thread["frameTable"]
    stacks, samples = thread["stackTable"], thread["samples"]
    location, line = frames["schema"]["location"], frames["schema"]["line"]
    prefix, frame = stacks["schema"]["prefix"], stacks["schema"]["frame"]
    counts = {}
    for sample in samples["data"]:
        names, index = [], sample[samples["schema"]["stack"]]
        while index is not None:
            row = frames["data"][stacks["data"][index][frame]]
            names.append(strings[row[location]] + (f":{row[line]}" if row[line] else ""))
            index = stacks["data"][index][prefix]
        key = ";".join(reversed(names))
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_every_sample_is_there_at_the_real_interval():
    info = ExportInfo(start=1_700_000_000, end=1_700_000_060, mode="cpu", interval=0.02)
    document = json.loads(EXPORTS["gecko"].render(COUNTS, info))
    expected = {";".join(map(unescape_frame, split_frames(s))): c for s, c in COUNTS.items()}
    assert rebuilt(document) == expected
    assert document["meta"]["interval"] == 20.0  # 50 Hz: 20 ms a sample, not 10
    assert document["meta"]["startTime"] == 1_700_000_000_000
    times = [s[1] for s in document["threads"][0]["samples"]["data"]]
    assert times[-1] == pytest.approx((43 - 1) * 20.0)  # 43 samples laid out 20 ms apart
    frames = document["threads"][0]["frameTable"]
    lines = [row[frames["schema"]["line"]] for row in frames["data"]]
    assert 42 in lines  # the recorded line number, split off the name


def test_too_many_samples_is_a_clear_error():
    with pytest.raises(ValueError, match="shorter window"):
        gecko_document({"a;b": 3_000_000}, ExportInfo(0, 60))


def test_the_api_serves_it_as_a_download(client):
    answer = client.get(f"/api/export?format=gecko&from={T0}&to={T0 + 3600}")
    assert answer.status_code == 200
    assert answer.headers["Content-Disposition"].endswith('.gecko.json"')
    assert answer.json["meta"]["version"] >= 24 and len(answer.json["threads"]) == 1
