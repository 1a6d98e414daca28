"""A process's output kept with bounded memory: the head and the tail, the rest counted.

A command that prints hundreds of megabytes (a test run, a harness's flood) must not cost the
host (and its parallel siblings) gigabytes. The stream is drained to the end (the process is not
blocked on a full pipe) but only ``head_bytes`` + ``tail_bytes`` are kept, and, where a head is
kept (a grader's log), at most ``max_lines`` lines of each part; what was dropped is counted.
"""

from __future__ import annotations

from collections import deque

from pydantic import BaseModel

HEAD_BYTES = 1 << 20
TAIL_BYTES = 4 << 20
MAX_LINES = 50_000


class OutputStats(BaseModel):
    """How much a run printed and how much of it was kept."""

    bytes: int = 0
    lines: int = 0
    dropped_bytes: int = 0
    dropped_lines: int = 0

    @property
    def truncated(self) -> bool:
        return self.dropped_bytes > 0 or self.dropped_lines > 0


def _cap_lines(text: str, max_lines: int, keep_end: bool) -> str:
    lines = text.splitlines(keepends=True)
    if len(lines) <= max_lines:
        return text
    return "".join(lines[-max_lines:] if keep_end else lines[:max_lines])


class BoundedOutput:
    """Fed a stream's chunks; keeps its first ``head_bytes`` and last ``tail_bytes``."""

    def __init__(self, tail_bytes: int = TAIL_BYTES, head_bytes: int = 0, max_lines: int = MAX_LINES):
        self.tail_bytes, self.head_bytes, self.max_lines = tail_bytes, head_bytes, max_lines
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0
        self.lines = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.lines += chunk.count(b"\n")
        room = self.head_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_len += len(chunk)
            while self.tail_len - len(self.tail[0]) >= self.tail_bytes:
                self.tail_len -= len(self.tail.popleft())

    def _tail(self) -> bytes:
        return b"".join(self.tail)[-self.tail_bytes :] if self.tail and self.tail_bytes else b""

    def text(self) -> str:
        """Without a head, the tail as it is (a stream the caller parses); with one, head + a marker
        naming what was dropped + tail, each part capped at ``max_lines`` lines."""
        if not self.head_bytes:
            return self._tail().decode("utf-8", errors="replace")
        return self.text_and_stats()[0]

    def text_and_stats(self) -> tuple[str, OutputStats]:
        tail = self._tail()
        stats = OutputStats(bytes=self.total, lines=self.lines)
        stats.dropped_bytes = self.total - len(self.head) - len(tail)
        if not self.head_bytes:
            return tail.decode("utf-8", errors="replace"), stats
        head_text = _cap_lines(self.head.decode("utf-8", "replace"), self.max_lines, keep_end=False)
        tail_text = _cap_lines(tail.decode("utf-8", "replace"), self.max_lines, keep_end=True)
        stats.dropped_lines = self.lines - head_text.count("\n") - tail_text.count("\n")
        if stats.truncated:
            marker = (
                f"\n[polar grader: output truncated, {stats.dropped_bytes} bytes and "
                f"{stats.dropped_lines} lines dropped of {stats.bytes} bytes]\n"
            )
            return head_text + marker + tail_text, stats
        return head_text + tail_text, stats
