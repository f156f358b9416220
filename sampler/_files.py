"""Files the command line writes for the user (a profile, an SVG, a trace): written whole to a
temporary file beside the target, then renamed over it, so a reader never sees half a file."""

from __future__ import annotations

import os
import secrets
import stat

__all__ = ["temporary_beside", "write_text_atomically"]


def temporary_beside(path: str, prefix: str) -> tuple[int, str]:
    """Creates a new file in the folder of ``path``, open for writing, and returns its
    descriptor and name. Its mode is what ``open(path, "w")`` would leave: that of the file it
    will replace, else 0666 less the umask (tempfile.mkstemp's 0600 would keep a profile or
    trace from the user's colleagues and web servers; reading the umask would change it)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        name = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(name, flags, 0o666)  # the kernel takes the umask off
        except FileExistsError:
            continue
        if mode is not None:
            try:
                os.fchmod(fd, mode)
            except OSError:  # a file system without modes (FAT, some CIFS): left as made
                pass
        return fd, name


def write_text_atomically(path: str, text: str) -> None:
    """Writes ``text`` (UTF-8) to ``path`` whole, or leaves it as it was."""
    fd, tmp = temporary_beside(path, ".fleetflame-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
