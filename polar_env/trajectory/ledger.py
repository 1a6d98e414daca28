"""The call ledger: a per-session write-ahead log on disk.

Layout: ``<root>/sessions/<session_id>/session.json`` (the SessionInfo, replaced atomically) and
``calls.jsonl`` (one CallRecord a line). ``append`` returns only once the line is in the OS (and
on disk with ``fsync=True``), so the proxy answers the harness only for calls a restarted proxy
will find again. A crash mid-write leaves a torn last line; ``recover`` moves it aside and says so,
because a record that cannot be parsed must never be half-accepted.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, Field, ValidationError

from polar_env.trajectory.records import CallRecord, SessionInfo

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SESSION_FILE = "session.json"
CALLS_FILE = "calls.jsonl"


class LedgerError(ValueError):
    """The ledger on disk is not what it should be (corrupt line, missing session)."""


class TornLine(BaseModel):
    """An unfinished write found at the end of a session's log and moved aside."""

    session_id: str
    offset: int  # byte offset of the torn tail in calls.jsonl (the file is truncated here)
    length: int
    saved_to: str


class SessionRecovery(BaseModel):
    session_id: str
    calls: int = 0
    torn: TornLine | None = None
    errors: list[str] = Field(default_factory=list)


class RecoveryReport(BaseModel):
    sessions: list[SessionRecovery] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)  # problems not tied to one readable session

    @property
    def total_calls(self) -> int:
        return sum(s.calls for s in self.sessions)

    @property
    def torn(self) -> list[TornLine]:
        return [s.torn for s in self.sessions if s.torn is not None]

    @property
    def all_errors(self) -> list[str]:
        return self.errors + [e for s in self.sessions for e in s.errors]

    @property
    def ok(self) -> bool:
        return not self.torn and not self.all_errors


def validate_session_id(session_id: str) -> str:
    """Session ids become directory names: allow no separators, no traversal, no hidden names."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise ValueError(f"invalid session id {session_id!r}: use letters, digits, '_', '.', '-' "
                         "(first a letter or digit, at most 128)")
    return session_id


class Ledger:
    """Durable per-session call log; safe for one asyncio loop (appends are synchronous)."""

    def __init__(self, root: Path, *, fsync: bool = False):
        self.root = Path(root)
        self.fsync = fsync
        self._sessions_dir = self.root / "sessions"
        self._sessions_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._lock = threading.RLock()

    # -- sessions --------------------------------------------------------------------------------
    def create_session(self, info: SessionInfo) -> None:
        """Persist a new session; an id already on disk is refused, never overwritten."""
        folder = self._dir(info.session_id)
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / SESSION_FILE
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise ValueError(f"session {info.session_id!r} already exists in the ledger") from None
            os.close(fd)
            self._write_session(folder, info)
            if self.fsync:
                _fsync_dir(folder)
                _fsync_dir(self._sessions_dir)

    def update_session(self, info: SessionInfo) -> None:
        folder = self._dir(info.session_id)
        if not (folder / SESSION_FILE).is_file():
            raise LedgerError(f"session {info.session_id!r} is not in the ledger")
        with self._lock:
            self._write_session(folder, info)

    def session(self, session_id: str) -> SessionInfo | None:
        path = self._dir(session_id) / SESSION_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        if not text:  # created but not yet written: a crash inside create_session
            return None
        return SessionInfo.model_validate_json(text)

    def sessions(self) -> list[SessionInfo]:
        found = []
        for folder in sorted(self._sessions_dir.iterdir()):
            if folder.is_dir() and SESSION_ID_RE.match(folder.name):
                info = self.session(folder.name)
                if info is not None:
                    found.append(info)
        return sorted(found, key=lambda s: (s.created_at, s.session_id))

    def close_session(self, session_id: str) -> None:
        """Release the session's append handle (its records stay on disk)."""
        self._dir(session_id)
        with self._lock:
            handle = self._handles.pop(session_id, None)
            if handle is not None:
                self._sync(handle)
                handle.close()

    def remove_session(self, session_id: str) -> None:
        """Delete a finished session's records (its trajectory was built and handed on)."""
        self.close_session(session_id)
        with self._lock:
            shutil.rmtree(self._dir(session_id), ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            for session_id in list(self._handles):
                self.close_session(session_id)

    # -- calls -----------------------------------------------------------------------------------
    def append(self, record: CallRecord) -> None:
        """Write one record as one line; on return it is in the OS (on disk with ``fsync``)."""
        line = record.model_dump_json().encode() + b"\n"
        with self._lock:
            handle = self._handle(record.session_id)
            start = handle.tell()
            try:
                handle.write(line)
                handle.flush()
                self._sync(handle)
            except BaseException:
                # A partial line would glue itself to the next record: cut it off and reopen.
                self._handles.pop(record.session_id, None)
                try:
                    handle.close()
                finally:
                    os.truncate(self._dir(record.session_id) / CALLS_FILE, start)
                raise

    def calls(self, session_id: str) -> list[CallRecord]:
        """The session's finished records in file order; an unterminated tail (a write in flight
        or a torn line not yet recovered) is not a finished record and is left out."""
        path = self._dir(session_id) / CALLS_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        records = []
        for offset, line in _complete_lines(data):
            record = _parse(line)
            if record is None:
                raise LedgerError(f"session {session_id!r}: corrupt record at byte {offset} of {path} "
                                  "(run Ledger.recover())")
            records.append(record)
        return records

    def recover(self) -> RecoveryReport:
        """Check every session on disk after a restart; move torn tails and corrupt lines aside.

        A torn tail (unterminated line, or unparseable lines after the last good one) is truncated
        off and saved to ``calls.jsonl.torn-<offset>``; unparseable lines *before* a good one are
        corruption, not a crash artefact: they are moved to ``calls.jsonl.corrupt`` and reported
        as errors. Either way the log left behind holds only whole, valid records.
        """
        report = RecoveryReport()
        with self._lock:
            self.close()
            for folder in sorted(self._sessions_dir.iterdir()):
                if not folder.is_dir():
                    continue
                if not SESSION_ID_RE.match(folder.name):
                    report.errors.append(f"{folder}: not a valid session directory name")
                    continue
                report.sessions.append(self._recover_session(folder))
        return report

    # -- internals -------------------------------------------------------------------------------
    def _dir(self, session_id: str) -> Path:
        return self._sessions_dir / validate_session_id(session_id)

    def _write_session(self, folder: Path, info: SessionInfo) -> None:
        tmp = folder / f".{SESSION_FILE}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(info.model_dump_json(indent=1).encode())
            handle.flush()
            self._sync(handle)
        os.replace(tmp, folder / SESSION_FILE)
        if self.fsync:
            _fsync_dir(folder)

    def _handle(self, session_id: str) -> BinaryIO:
        handle = self._handles.get(session_id)
        if handle is not None:
            return handle
        folder = self._dir(session_id)
        if not (folder / SESSION_FILE).is_file():
            raise LedgerError(f"session {session_id!r} is not in the ledger; create it first")
        path = folder / CALLS_FILE
        if path.exists() and path.stat().st_size and _last_byte(path) != b"\n":
            # This process never wrote that tail: a crash did. Never append onto it.
            self._recover_session(folder)
        new = not path.exists()
        handle = open(path, "ab")  # noqa: SIM115 - kept open across appends on purpose
        if new and self.fsync:
            _fsync_dir(folder)
        self._handles[session_id] = handle
        return handle

    def _sync(self, handle: BinaryIO) -> None:
        if self.fsync:
            os.fsync(handle.fileno())

    def _recover_session(self, folder: Path) -> SessionRecovery:
        session_id = folder.name
        result = SessionRecovery(session_id=session_id)
        if self.session(session_id) is None:
            result.errors.append(f"session {session_id!r}: {SESSION_FILE} missing or empty")
        path = folder / CALLS_FILE
        if not path.exists():
            return result
        data = path.read_bytes()
        lines = list(_all_lines(data))  # (offset, bytes, terminated)
        parsed = [(off, raw, term, _parse(raw) if term else None) for off, raw, term in lines]
        last_good = max((i for i, p in enumerate(parsed) if p[3] is not None), default=-1)
        tail = parsed[last_good + 1:]
        corrupt = [(off, raw) for off, raw, _, rec in parsed[:last_good + 1] if rec is None]
        good = [rec for *_, rec in parsed[:last_good + 1] if rec is not None]
        if tail:
            offset = tail[0][0]
            saved = _unique(folder / f"{CALLS_FILE}.torn-{offset}")
            saved.write_bytes(data[offset:])
            result.torn = TornLine(session_id=session_id, offset=offset, length=len(data) - offset,
                                   saved_to=str(saved))
        if corrupt:
            with open(folder / f"{CALLS_FILE}.corrupt", "ab") as handle:
                for off, raw in corrupt:
                    handle.write(b"# offset %d\n" % off + raw + b"\n")
            for off, _ in corrupt:
                result.errors.append(f"session {session_id!r}: corrupt record at byte {off} "
                                     f"(not the last line; moved to {CALLS_FILE}.corrupt)")
            tmp = folder / f".{CALLS_FILE}.tmp"
            tmp.write_bytes(b"".join(raw + b"\n" for _, raw, _, rec in parsed[:last_good + 1]
                                     if rec is not None))
            os.replace(tmp, path)
        elif tail:
            os.truncate(path, tail[0][0])
        if tail or corrupt:
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
            _fsync_dir(folder)
        seen: set[int] = set()
        for rec in good:
            if rec.session_id != session_id:
                result.errors.append(f"session {session_id!r}: record {rec.call_index} belongs to "
                                     f"session {rec.session_id!r}")
            if rec.call_index in seen:
                result.errors.append(f"session {session_id!r}: call_index {rec.call_index} appears twice")
            seen.add(rec.call_index)
        result.calls = len(good)
        return result


def _all_lines(data: bytes):
    """Yield (offset, line without newline, terminated) for every line, the last possibly unterminated."""
    offset = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end < 0:
            yield offset, data[offset:], False
            return
        yield offset, data[offset:end], True
        offset = end + 1


def _complete_lines(data: bytes):
    for offset, line, terminated in _all_lines(data):
        if terminated:
            yield offset, line


def _parse(line: bytes) -> CallRecord | None:
    try:
        return CallRecord.model_validate_json(line)
    except (ValidationError, ValueError):
        return None


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def _unique(path: Path) -> Path:
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
