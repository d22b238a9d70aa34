"""Reading the server's log (:mod:`kit.logfile`) as ``mlx-kit logs`` does: the last lines
of a run (:func:`last_lines`), following it across rotations (:class:`Follower`,
:func:`follow`), and a line as a record (:func:`record`, for ``--json``)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from kit.logfile import open_ours


_BLOCK = 64 * 1024
#: a line :data:`kit.logfile.FORMAT` wrote: time (milliseconds optional), level, logger
_RECORD = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d{3})?) ([A-Z]+) ([^\s:]+): (.*)",
                     re.S)


def record(line: str) -> dict[str, str | None]:
    """One log line as ``{"time", "level", "logger", "message"}`` (the line without its
    newline). A line not in the log's format (a start marker, a line of a multi-line
    message) is all message, its other fields None: one record a line, so ``-f`` prints
    each as it comes."""
    line = line.rstrip("\n")
    m = _RECORD.fullmatch(line)
    if m is None:
        return {"time": None, "level": None, "logger": None, "message": line}
    return dict(zip(("time", "level", "logger", "message"), m.groups()))


def last_lines(path: Path, n: int, limit: int = 16 * 2**20, end: int | None = None,
               file: BinaryIO | None = None) -> list[str]:
    """The last ``n`` lines of the file at ``path`` before byte ``end`` (default: its
    end), without their newlines, reading backwards in blocks and at most ``limit`` bytes.
    ``file``: that file already open (binary; read, not closed), so the caller can go on
    following the very file it measured.

    Raises:
        OSError: the file cannot be opened.
    """
    if n <= 0:
        return []
    if file is None:
        with open_ours(path) as f:
            return last_lines(path, n, limit, end, f)
    f = file
    size = f.seek(0, os.SEEK_END)
    end = size if end is None else min(end, size)
    data, pos = b"", end
    while pos > 0 and data.count(b"\n") <= n and end - pos < limit:
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    if pos > 0 and lines:
        lines = lines[1:]  # the first one is cut
    return lines[-n:]


class Follower:
    """Follows the text appended to ``path`` from byte ``start`` (default: its end), as
    ``tail -F`` does: when the file is rotated (the path names another file) or
    truncated, the rest of the old file is read and then the new one from its start; a
    missing file is waited for. Iterating yields whole lines (each with its newline): a
    line the writer has not ended yet is held back (:attr:`pending`) until its newline
    comes, or its file is rotated away. Iteration ends when ``stop()`` is true (checked
    every ``poll`` seconds while nothing arrives).

    Args:
        file: ``path`` already opened (binary) by the caller, who measured ``start`` on
            it: followed from there, so a rotation between the caller's look and ours
            cannot make us skip the new file's start. Closed when iteration ends.

    Own code: no maintained library follows a file across a rename (``tailer`` and
    ``pygtail`` read from an offset, without rotation)."""

    def __init__(self, path: Path, start: int | None = None, poll: float = 0.2,
                 stop: Callable[[], bool] = lambda: False,
                 file: BinaryIO | None = None) -> None:
        import codecs

        self.path, self.start, self.poll, self.stop, self.file = path, start, poll, stop, file
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        #: the text after the last newline seen: a line not ended yet
        self.pending = ""

    def _lines(self, data: bytes, final: bool = False) -> str:
        """The whole lines ``data`` completes (``final``: the file ends here, so its
        unended last line too, given a newline)."""
        text = self.pending + self._decode(data, final)
        cut = text.rfind("\n") + 1
        self.pending = text[cut:]
        if final and self.pending:
            text, cut, self.pending = text + "\n", len(text) + 1, ""
        return text[:cut]

    def __iter__(self) -> Iterator[str]:
        f, start, path = self.file, self.start, self.path
        if f is not None:
            f.seek(0, os.SEEK_END) if start is None else f.seek(start)
            start = 0
        try:
            while not self.stop():
                if f is None:
                    try:
                        f = open_ours(path)
                    except OSError:  # created later (all of it is new), or, until it is
                        start = 0  # ours again, another user's file or link: not shown
                        time.sleep(self.poll)
                        continue
                    f.seek(0, os.SEEK_END) if start is None else f.seek(start)
                    start = 0  # a file opened after this one is new from its start
                chunk = f.read(_BLOCK)
                if chunk:
                    if text := self._lines(chunk):
                        yield text
                    continue
                try:
                    now = os.stat(path)
                except FileNotFoundError:
                    now = None
                mine = os.fstat(f.fileno())
                if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                    # rotated: what was written before the rename, its last line ended
                    if text := self._lines(f.read(), final=True):
                        yield text
                    f.close()
                    f = None
                    continue
                if now.st_size < f.tell():  # truncated in place
                    f.seek(0)
                    continue
                time.sleep(self.poll)
        finally:
            if f is not None:
                f.close()


def follow(path: Path, start: int | None = None, poll: float = 0.2,
           stop: Callable[[], bool] = lambda: False, file: BinaryIO | None = None
           ) -> Iterator[str]:
    """Iterate a :class:`Follower` (same arguments): whole lines, then when ``stop()``
    ends it, the unended last line (if any, given a newline)."""
    follower = Follower(path, start, poll, stop, file)
    yield from follower
    if follower.pending:
        yield follower.pending + "\n"
