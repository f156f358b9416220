"""pprof's profile.proto, gzipped: what `go tool pprof` and Pyroscope read.

The message layout is github.com/google/pprof/proto/profile.proto. Each distinct folded stack
becomes one sample with two values: the sample count and the time it stands for in
nanoseconds. Locations and functions are deduplicated; a frame ending in ``:LINE`` (the
sampler's ``lineno=True``) keeps its line number on the location.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping

from sampler.profile import split_frames, split_line_number, unescape_frame
from webui.exports.base import Export, ExportInfo
from webui.exports.protobuf import Message, varint

__all__ = ["PPROF", "render_pprof"]

# Field numbers from profile.proto.
_PROFILE_SAMPLE_TYPE = 1
_PROFILE_SAMPLE = 2
_PROFILE_LOCATION = 4
_PROFILE_FUNCTION = 5
_PROFILE_STRING_TABLE = 6
_PROFILE_TIME_NANOS = 9
_PROFILE_DURATION_NANOS = 10
_PROFILE_PERIOD_TYPE = 11
_PROFILE_PERIOD = 12
_PROFILE_COMMENT = 13
_VALUE_TYPE_TYPE, _VALUE_TYPE_UNIT = 1, 2
_SAMPLE_LOCATION_ID, _SAMPLE_VALUE = 1, 2
_LOCATION_ID, _LOCATION_LINE = 1, 4
_LINE_FUNCTION_ID, _LINE_LINE = 1, 2
_FUNCTION_ID, _FUNCTION_NAME, _FUNCTION_SYSTEM_NAME, _FUNCTION_FILENAME = 1, 2, 3, 4


class _Strings:
    """pprof's string table: index 0 is always the empty string."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}
        self.table: list[str] = [""]

    def __call__(self, text: str) -> int:
        i = self.index.get(text)
        if i is None:
            i = self.index[text] = len(self.table)
            self.table.append(text)
        return i


def _value_type(strings: _Strings, kind: str, unit: str) -> Message:
    return Message().uint(_VALUE_TYPE_TYPE, strings(kind)).uint(_VALUE_TYPE_UNIT, strings(unit))


def render_pprof(counts: Mapping[str, int], info: ExportInfo) -> bytes:
    """Renders the profile as gzipped profile.proto bytes."""
    strings = _Strings()
    profile = Message()
    time_type = "cpu" if info.mode == "cpu" else "wall"
    profile.message(_PROFILE_SAMPLE_TYPE, _value_type(strings, "samples", "count"))
    profile.message(_PROFILE_SAMPLE_TYPE, _value_type(strings, time_type, "nanoseconds"))
    period_ns = round(info.interval * 1e9)

    functions: dict[str, int] = {}  # frame name (without line) -> function id
    locations: dict[str, int] = {}  # escaped frame -> location id
    location_messages: list[Message] = []
    function_messages: list[Message] = []
    samples: list[tuple[list[int], int]] = []
    for stack, count in sorted(counts.items()):
        if count <= 0 or not stack:
            continue
        ids = []
        for frame in split_frames(stack):
            location = locations.get(frame)
            if location is None:
                name, line = split_line_number(unescape_frame(frame))
                function = functions.get(name)
                if function is None:
                    function = functions[name] = len(functions) + 1
                    module = name.partition(":")[0]
                    function_messages.append(
                        Message()
                        .uint(_FUNCTION_ID, function)
                        .uint(_FUNCTION_NAME, strings(name))
                        .uint(_FUNCTION_SYSTEM_NAME, strings(name))
                        .uint(_FUNCTION_FILENAME, strings(module))
                    )
                location = locations[frame] = len(locations) + 1
                line_message = Message().uint(_LINE_FUNCTION_ID, function).uint(_LINE_LINE, line)
                location_messages.append(
                    Message().uint(_LOCATION_ID, location).message(_LOCATION_LINE, line_message)
                )
            ids.append(location)
        ids.reverse()  # pprof lists a sample's locations leaf first
        samples.append((ids, count))

    ids_table = [varint(i) for i in range(len(locations) + 1)]
    for ids, count in samples:
        sample = Message().packed(_SAMPLE_LOCATION_ID, ids, ids_table)
        sample.packed(_SAMPLE_VALUE, (count, count * period_ns))
        profile.message(_PROFILE_SAMPLE, sample)
    for message in location_messages:
        profile.message(_PROFILE_LOCATION, message)
    for message in function_messages:
        profile.message(_PROFILE_FUNCTION, message)
    profile.uint(_PROFILE_TIME_NANOS, info.start * 1_000_000_000)
    profile.uint(_PROFILE_DURATION_NANOS, max(info.end - info.start, 0) * 1_000_000_000)
    profile.message(_PROFILE_PERIOD_TYPE, _value_type(strings, time_type, "nanoseconds"))
    profile.uint(_PROFILE_PERIOD, period_ns)
    profile.packed(_PROFILE_COMMENT, [strings(f"fleetflame: {info.title}")])
    # The string table goes last: every other part has registered its strings by now.
    for text in strings.table:
        profile.string(_PROFILE_STRING_TABLE, text)
    return gzip.compress(bytes(profile), compresslevel=6, mtime=0)


PPROF = Export("pprof", "application/octet-stream", "pb.gz", render_pprof)
