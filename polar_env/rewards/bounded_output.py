"""Read a test run's output with bounded memory: keep the head and the tail, count the rest.

A patch that prints hundreds of megabytes must not cost the grader (and its parallel siblings)
gigabytes. The stream is drained to the end (the run is not blocked on a full pipe) but only
``head_bytes`` + ``tail_bytes`` are kept, and at most ``max_lines`` lines of each part; what was
dropped is counted and recorded on the grade.
"""

from __future__ import annotations

from collections import deque
from typing import BinaryIO

from pydantic import BaseModel

HEAD_BYTES = 1 << 20
TAIL_BYTES = 4 << 20
MAX_LINES = 50_000
CHUNK = 1 << 16


class OutputStats(BaseModel):
    """How much a run printed and how much of it the grader kept."""

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


def read_bounded(
    stream: BinaryIO, *, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES, max_lines: int = MAX_LINES
) -> tuple[str, OutputStats]:
    """Drain ``stream``; return (head + marker + tail text, stats). Memory stays O(head + tail)."""
    head = bytearray()
    tail: deque[bytes] = deque()
    tail_len = 0
    stats = OutputStats()
    while chunk := stream.read1(CHUNK) if hasattr(stream, "read1") else stream.read(CHUNK):
        stats.bytes += len(chunk)
        stats.lines += chunk.count(b"\n")
        room = head_bytes - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            tail.append(chunk)
            tail_len += len(chunk)
            while tail_len - len(tail[0]) >= tail_bytes:
                tail_len -= len(tail.popleft())
    tail_bytes_kept = b"".join(tail)[-tail_bytes:] if tail else b""
    stats.dropped_bytes = stats.bytes - len(head) - len(tail_bytes_kept)
    head_text = _cap_lines(head.decode("utf-8", "replace"), max_lines, keep_end=False)
    tail_text = _cap_lines(tail_bytes_kept.decode("utf-8", "replace"), max_lines, keep_end=True)
    stats.dropped_lines = stats.lines - head_text.count("\n") - tail_text.count("\n")
    if stats.truncated:
        marker = (f"\n[polar grader: output truncated, {stats.dropped_bytes} bytes and "
                  f"{stats.dropped_lines} lines dropped of {stats.bytes} bytes]\n")
        return head_text + marker + tail_text, stats
    return head_text + tail_text, stats
