"""Frame names, their escaping, and folded stacks as lists of frames.

A frame is named ``module:qualname``; a folded stack is its frames from the root to the leaf,
joined by ``;`` (docs/wire-format.md). Frame names are percent-escaped so that no name can
hold the separator, a line break, or anything JSON would escape: this module is the one
definition of that escaping, and webui/static/js/frames.js its JavaScript twin (both are
tested against tests/data/hostile_frames.json).
"""

from __future__ import annotations

import re

__all__ = [
    "NO_FRAMES",
    "OTHER",
    "PRUNED",
    "SEPARATOR",
    "TRUNCATED",
    "MAX_LABELS",
    "MAX_NAME",
    "MAX_TEXT",
    "display_frames",
    "encodable_text",
    "escape_frame",
    "join_frames",
    "label_param",
    "label_text",
    "parse_label",
    "shown_frame",
    "split_frames",
    "split_line_number",
    "stack_problem",
    "thread_frame",
    "unescape_frame",
]

SEPARATOR = ";"
# Synthetic frames (docs/wire-format.md): in square brackets, never a module:qualname.
TRUNCATED = "[truncated]"
OTHER = "[other]"
PRUNED = "[pruned]"  # the web UI's remainder of frames below its display threshold
NO_FRAMES = "[no frames]"  # a sample that caught no Python frame (py-spy writes them)

# Characters that would break a folded line: the separator, the escape character itself,
# and every control character (newlines above all); also the two characters JSON escapes, so
# a frame's JSON string is always its text in quotes; and lone surrogates, which UTF-8 cannot
# hold (os.fsdecode's stand-ins for the bytes of a file name it could not decode).
_UNSAFE = re.compile(r'[%;"\\\x00-\x1f\x7f\ud800-\udfff]')
_ESCAPED = re.compile(r"%([0-9A-F]{2})")
# What no folded stack holds once its frames are escaped; lone surrogates cannot be encoded
# in UTF-8, so no stack read from the wire or stored holds one either. These two patterns are
# compiled on first use (re caches them), not when the sampler imports this module.
_FORBIDDEN_IN_STACK = r"[\x00-\x1f\x7f\ud800-\udfff]"
_LINE_NUMBER = r"(.+:.+):(\d+)"


def escape_frame(name: str) -> str:
    """Returns ``name`` with ``;``, ``%``, ``"``, ``\\`` and control characters percent-escaped,
    and each lone surrogate written out as ``\\udcXX`` (escaped: ``%5Cudcxx``)."""
    if _UNSAFE.search(name) is None:
        return name
    return _UNSAFE.sub(_escaped, name)


def _escaped(match: re.Match[str]) -> str:
    c = match.group()
    if c >= "\ud800":
        return f"%5Cu{ord(c):04x}"  # as Python's backslashreplace writes it, \\ escaped
    return f"%{ord(c):02X}"


# The wire format's bounds on labels (its Limits' defaults, docs/wire-format.md): labels in a
# set, and characters in a label key (and service, host) and in a label value.
MAX_LABELS = 64
MAX_NAME = 256
MAX_TEXT = 1024


def label_text(text: str, longest: int) -> str:
    """A label's key or value as the wire takes it: lone surrogates written out (see
    encodable_text), then cut to ``longest`` characters."""
    return encodable_text(text)[:longest]


def encodable_text(text: str) -> str:
    """Returns ``text`` (a label, say) with each lone surrogate written out as ``\\udcXX``, as
    escape_frame does: the profile is UTF-8, which cannot hold one."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


# Characters that change how the text around them is shown without being seen: bidirectional
# overrides, embeddings, isolates and marks (U+202E makes "gnp.exe" read "exe.png"), zero-width
# characters, and line and paragraph separators. A name is shown with each as [U+XXXX].
_INVISIBLE = re.compile(r"[\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def shown_frame(name: str) -> str:
    """Returns an unescaped frame name as it may be put on a screen: every invisible character
    that could make it pass for another name written out as ``[U+XXXX]``."""
    if _INVISIBLE.search(name) is None:
        return name
    return _INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", name)


def unescape_frame(name: str) -> str:
    """Reverses :func:`escape_frame`."""
    if "%" not in name:
        return name
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), name)


def thread_frame(thread_name: str) -> str:
    """Returns the escaped root frame naming a thread, ``[thread:NAME]``."""
    return escape_frame(f"[thread:{thread_name}]")


def split_frames(stack: str) -> list[str]:
    """Returns the (escaped) frames of a folded stack, root first."""
    return stack.split(SEPARATOR)


def join_frames(frames: list[str] | tuple[str, ...]) -> str:
    """Returns the folded stack of escaped frames given root first."""
    return SEPARATOR.join(frames)


def display_frames(stack: str) -> list[str]:
    """Returns the frames of a folded stack as people read them (unescaped), root first."""
    if "%" not in stack:
        return stack.split(SEPARATOR)
    return [unescape_frame(frame) for frame in stack.split(SEPARATOR)]


def split_line_number(name: str) -> tuple[str, int]:
    """Splits an (unescaped) frame named with its line, ``module:qualname:LINE`` (the sampler's
    ``lineno=True``), into the function's name and the line; 0 when it has none."""
    match = re.fullmatch(_LINE_NUMBER, name)
    if match is None:
        return name, 0
    return match.group(1), int(match.group(2))


def stack_problem(stack: object, max_length: int = 65_536) -> str | None:
    """Returns what makes ``stack`` no valid folded stack (not a string, empty, longer than
    ``max_length`` characters, a control character or lone surrogate, an empty frame), or
    None when it is one."""
    if not isinstance(stack, str) or not stack:
        return f"a stack must be a non-empty string, got {stack!r:.40}"
    if len(stack) > max_length:
        return f"the stack is {len(stack)} characters, longer than the limit of {max_length}"
    if re.search(_FORBIDDEN_IN_STACK, stack):
        return f"the stack {stack[:60]!r} holds a control character or a lone surrogate"
    if stack[0] == SEPARATOR or stack[-1] == SEPARATOR or SEPARATOR * 2 in stack:
        return f"the stack {stack[:60]!r} has an empty frame"
    return None


def parse_label(item: str) -> tuple[str, str] | None:
    """A label filter as people and URLs write it: ``key:value``, split at the first ``:``, or
    ``"key":value`` with the key a JSON string (a key holding ``:``, as label_param writes
    it); None when it is neither. The web UI's ``label`` parameter and the command lines' read
    it alike."""
    if item.startswith('"'):
        import json  # here: the sampler imports this module at start-up

        try:
            key, end = json.JSONDecoder().raw_decode(item)
        except ValueError:
            key, end = None, 0
        if isinstance(key, str) and item[end : end + 1] == ":":
            return key, item[end + 1 :]
    key, sep, value = item.partition(":")
    return (key, value) if sep else None


def label_param(key: str, value: str) -> str:
    """A label filter as parse_label reads it: ``key:value``, the key written as a JSON string
    where it holds ``:`` or starts with ``"`` (the twin of labelParam in the web UI's
    static/js/state.js)."""
    if ":" in key or key.startswith('"'):
        import json

        key = json.dumps(key, ensure_ascii=False)
    return f"{key}:{value}"
