"""The call ledger: a per-session write-ahead log on disk.

Layout: ``<root>/sessions/<session_id>/session.json`` (the SessionInfo, replaced atomically) and
``calls.jsonl`` (one call a line). ``append`` returns only once the line is in the OS (and on disk
with ``fsync=True``), so the proxy answers the harness only for calls a restarted proxy will find
again. A crash mid-write leaves a torn last line; ``recover`` moves it aside and says so, because a
record that cannot be parsed must never be half-accepted.

A line (format 2, ``CallLine``) holds what the call adds to its parent: the appended prompt ids,
the new messages, the sampled ids, plus the whole prompt's length and SHA-256. Reading rebuilds
each prompt from its parent chain and checks it against that hash, so the bytes of a session grow
with its distinct tokens while a rebuilt prompt is still proven token-exact. Format-1 lines (the
whole call, written before) are read as they are: old ledgers need no migration step.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from pydantic import BaseModel, Field, ValidationError

from polar_env.trajectory.records import (
    RECORD_SCHEMA_VERSION,
    CallFields,
    CallLine,
    CallRecord,
    PromptIds,
    SessionInfo,
    ids_digest,
)

T = TypeVar("T")
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
        raise ValueError(
            f"invalid session id {session_id!r}: use letters, digits, '_', '.', '-' "
            "(first a letter or digit, at most 128)"
        )
    return session_id


class Ledger:
    """Durable per-session call log; appends are thread-safe, ``append_async`` runs them on the
    ledger's own writer thread so disk waits (fsync) never stall the event loop or the tokenizer."""

    def __init__(self, root: Path, *, fsync: bool = False):
        self.root = Path(root)
        self.fsync = fsync
        self._sessions_dir = self.root / "sessions"
        self._sessions_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._lock = threading.RLock()
        self._writer: ThreadPoolExecutor | None = None
        self._queued = 0  # append_async writes handed to the writer thread and not yet done

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
            writer, self._writer = self._writer, None
        if writer is not None:  # its queued lines are written first
            writer.shutdown(wait=True)

    # -- calls -----------------------------------------------------------------------------------
    async def append_async(self, record: CallRecord, *, small: bool = False) -> None:
        """``append`` on the writer thread; returns once the line is written, like ``append``.

        A ``small`` record (a turn's worth of ids) is written here on the loop when nothing is
        queued for the writer and nobody holds the ledger: without ``fsync`` that is one write
        into the page cache, cheaper than the hop to the thread and back (the line still reaches
        the OS before the caller answers, and lines keep their order).

        Cancelling the caller does not cancel the write (a queued write would otherwise be dropped
        while the caller believes its record is on disk): the cancel waits for the line, then
        goes through."""
        if small and not self.fsync and not self._queued and self._lock.acquire(blocking=False):
            try:
                self.append(record)
            finally:
                self._lock.release()
            return
        with self._lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-ledger")
        written = asyncio.get_running_loop().run_in_executor(self._writer, self.append, record)
        self._queued += 1
        written.add_done_callback(self._written)
        try:
            await asyncio.shield(written)
        except asyncio.CancelledError:
            await asyncio.wait([written])
            raise

    def _written(self, _future: asyncio.Future) -> None:
        self._queued -= 1

    def append(self, record: CallRecord) -> None:
        """Write one record as one line; on return it is in the OS (on disk with ``fsync``)."""
        line = encode_line(record)
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
        decoder = LineDecoder()
        for offset, line in _complete_lines(data):
            try:
                records.append(decoder.add(line))
            except LedgerError as exc:
                raise LedgerError(
                    f"session {session_id!r}: corrupt record at byte {offset} of {path}: {exc} "
                    "(run Ledger.recover())"
                ) from None
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
        decoder = LineDecoder()
        readable = [(off, raw, _try(decoder.parse, raw) if term else None) for off, raw, term in lines]
        # a crash tears only the end: lines after the last one that parses are a torn tail; a line
        # before it that does not parse, or does not rebuild (its parent is gone), is corruption
        last_good = max((i for i, (*_, line) in enumerate(readable) if line is not None), default=-1)
        tail = readable[last_good + 1 :]
        parsed = [
            (off, raw, line is not None, _try(decoder.rebuild, line) if line is not None else None)
            for off, raw, line in readable[: last_good + 1]
        ]
        why = {
            off: "does not rebuild from its parent chain" for off, _, ok, rec in parsed if ok and rec is None
        }
        corrupt = [(off, raw) for off, raw, _, rec in parsed if rec is None]
        good = [rec for *_, rec in parsed if rec is not None]
        if tail:
            offset = tail[0][0]
            saved = _unique(folder / f"{CALLS_FILE}.torn-{offset}")
            saved.write_bytes(data[offset:])
            result.torn = TornLine(
                session_id=session_id, offset=offset, length=len(data) - offset, saved_to=str(saved)
            )
        if corrupt:
            with open(folder / f"{CALLS_FILE}.corrupt", "ab") as handle:
                for off, raw in corrupt:
                    handle.write(b"# offset %d\n" % off + raw + b"\n")
            for off, _ in corrupt:
                result.errors.append(
                    f"session {session_id!r}: corrupt record at byte {off} "
                    f"({why.get(off, 'not the last line')}; moved to {CALLS_FILE}.corrupt)"
                )
            tmp = folder / f".{CALLS_FILE}.tmp"
            tmp.write_bytes(b"".join(raw + b"\n" for _, raw, _, rec in parsed if rec is not None))
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
                result.errors.append(
                    f"session {session_id!r}: record {rec.call_index} belongs to session {rec.session_id!r}"
                )
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


def encode_line(record: CallRecord) -> bytes:
    """The record as a format-2 line: what it adds to the ids, messages and tools its writer
    declared reused from the parent (``reused_prefix_len``, ``reused_messages``, ``reused_tools``)."""
    has_parent = record.parent_call_index is not None
    prompt = record.prompt_ids
    reused = record.reused_prefix_len if has_parent and record.reused_prefix_len <= len(prompt) else 0
    reused_messages = record.reused_messages if has_parent else 0
    line = CallLine.model_construct(
        **{name: getattr(record, name) for name in CallFields.model_fields},
        schema_version=RECORD_SCHEMA_VERSION,
        appended_ids=prompt[reused:],
        prompt_len=len(prompt),
        new_messages=record.messages[reused_messages:],
        tools=None if has_parent and record.reused_tools else record.tools,
    )
    line.reused_messages = reused_messages
    line.prompt_sha256 = record.prompt_sha256 or ids_digest(prompt).hexdigest()
    return line.model_dump_json().encode() + b"\n"


class LineDecoder:
    """Rebuilds a session's whole records from its lines, in file order (a parent's line always
    comes before its children's: the proxy extends only calls already in the ledger)."""

    def __init__(self) -> None:
        self.records: dict[int, CallRecord] = {}
        self._digests: dict[int, Any] = {}  # call index -> digest of its prompt + sampled ids

    def add(self, raw: bytes) -> CallRecord:
        """Decode one line (either format); ``LedgerError`` says why it cannot be a record."""
        return self.rebuild(self.parse(raw))

    @staticmethod
    def parse(raw: bytes) -> CallLine | CallRecord:
        """The line as written (format 2) or the whole record (format 1); ``LedgerError`` if neither."""
        try:
            return CallLine.model_validate_json(raw)
        except (ValidationError, ValueError) as exc:
            try:
                return CallRecord.model_validate_json(raw)
            except (ValidationError, ValueError):
                raise LedgerError(_why_unreadable(raw, exc)) from None

    def rebuild(self, parsed: CallLine | CallRecord) -> CallRecord:
        """The whole record of a parsed line; ``LedgerError`` when its parent chain does not give it."""
        record = parsed if isinstance(parsed, CallRecord) else self._rebuild(parsed)
        self.records[record.call_index] = record
        return record

    def _rebuild(self, line: CallLine) -> CallRecord:
        index, appended = line.call_index, line.appended_ids
        reused = line.prompt_len - len(appended)
        parent = None
        if reused or line.reused_messages or line.tools is None:
            parent = self.records.get(line.parent_call_index) if line.parent_call_index is not None else None
            if parent is None:
                raise LedgerError(
                    f"call {index} extends call {line.parent_call_index}, which is not before it in the log"
                )
        if reused < 0 or (parent is not None and reused > len(parent.prompt_ids) + len(parent.sampled_ids)):
            raise LedgerError(f"call {index} reuses {reused} ids its parent does not have")
        if parent is not None and line.reused_messages > len(parent.messages):
            raise LedgerError(
                f"call {index} reuses {line.reused_messages} messages; its parent has {len(parent.messages)}"
            )
        prompt: list[int] | PromptIds | None = None
        if parent is None:
            prompt, digest = list(appended), ids_digest(appended)
        else:
            n = len(parent.prompt_ids)
            if reused == n + len(parent.sampled_ids):  # the usual case: continue the parent's digest
                digest = ids_digest(appended, self._digest(parent))
            else:
                prompt = parent.prompt_ids[:reused]  # one copy of the reused prefix, then extended in place
                if reused > n:
                    prompt += parent.sampled_ids[: reused - n]
                prompt += appended
                digest = ids_digest(prompt)
        if digest.hexdigest() != line.prompt_sha256:
            raise LedgerError(
                f"call {index}: the prompt rebuilt from its parent chain ({line.prompt_len} ids) does "
                "not match its recorded SHA-256: a record it extends was altered"
            )
        if prompt is None:  # checked before the chain's shared list grows
            assert parent is not None
            base, n = parent.prompt_ids, len(parent.prompt_ids)
            if not (isinstance(base, PromptIds) and base.extends(n)):
                base = PromptIds(list(base), n)  # a branch, or a format-1 parent: the new chain's own list
            prompt = base.grown(parent.sampled_ids, appended)
        elif isinstance(prompt, list):
            prompt = PromptIds(prompt, len(prompt))
        self._digests[index] = ids_digest(line.sampled_ids, digest)
        fields = {name: getattr(line, name) for name in CallFields.model_fields}
        return CallRecord.model_construct(
            **fields,
            schema_version=line.schema_version,
            prompt_ids=prompt,
            messages=(parent.messages[: line.reused_messages] if parent else []) + line.new_messages,
            tools=parent.tools if line.tools is None and parent is not None else (line.tools or []),
            reused_tools=line.tools is None,
        )

    def _digest(self, record: CallRecord) -> Any:
        digest = self._digests.get(record.call_index)
        if digest is None:  # a format-1 parent: hash it once
            digest = self._digests[record.call_index] = ids_digest(record.prompt_ids + record.sampled_ids)
        return digest


def _try(fn: Callable[[Any], T], arg: Any) -> T | None:
    try:
        return fn(arg)
    except LedgerError:
        return None


def _why_unreadable(raw: bytes, exc: Exception) -> str:
    """One line naming the problem; a format newer than this code says so instead of 'corrupt'."""
    import json

    try:
        version = json.loads(raw).get("schema_version")
    except (ValueError, AttributeError):
        return "not a JSON object"
    if isinstance(version, int) and version > RECORD_SCHEMA_VERSION:
        return (
            f"written in ledger format {version}; this polar_env reads formats 1-{RECORD_SCHEMA_VERSION} "
            "(upgrade polar_env)"
        )
    return f"not a call record ({str(exc).splitlines()[0]})"


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
