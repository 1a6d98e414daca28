"""Who wrote into a directory, as the kernel says: a fanotify watch that records, for every entry of one
host directory created, written, renamed into, changed or removed, the host pid of the process that did
it (not what the process claims: fanotify reports the caller's pid from the kernel's own record).

Used for a Harbor verifier's reward directory (rewards/harbor_verifier.py): the reward files are read
only where their writers are the ones the verifier's own script allows. fanotify needs CAP_SYS_ADMIN
(host root); elsewhere `Writers.start` returns None and the caller says the check did not run. The
events name entries directly under the directory (``FAN_REPORT_DFID_NAME``); the directory must be on
a filesystem that reports file ids (tmpfs, ext4, xfs; the verifier's is a tmpfs of its own).
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_NOTIF = 0x1, 0x2, 0x0
FAN_REPORT_DIR_FID, FAN_REPORT_NAME = 0x400, 0x800
FAN_MARK_ADD = 0x1
FAN_MODIFY, FAN_CLOSE_WRITE, FAN_ATTRIB = 0x2, 0x8, 0x4
FAN_MOVED_FROM, FAN_MOVED_TO, FAN_CREATE, FAN_DELETE = 0x40, 0x80, 0x100, 0x200
FAN_ONDIR, FAN_EVENT_ON_CHILD = 0x40000000, 0x08000000
WATCHED = FAN_MODIFY | FAN_CLOSE_WRITE | FAN_ATTRIB | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_CREATE | FAN_DELETE
AT_FDCWD = -100
METADATA = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
INFO_HEADER = struct.Struct("=BBH")  # info_type, pad, len
FAN_EVENT_INFO_TYPE_DFID_NAME = 2


@dataclass
class Writers:
    """A running watch of ``directory``; `stop` returns what it saw."""

    directory: Path
    fd: int
    events: list[tuple[int, str]] = field(default_factory=list)  # (host pid, entry name)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def start(cls, directory: Path) -> Writers | None:
        """Watch ``directory``; None where this process may not (not host root) or the kernel cannot."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.fanotify_init(
            FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_DIR_FID | FAN_REPORT_NAME, os.O_RDONLY
        )
        if fd < 0:
            return None
        mask = ctypes.c_uint64(WATCHED | FAN_ONDIR | FAN_EVENT_ON_CHILD)
        if libc.fanotify_mark(fd, FAN_MARK_ADD, mask, AT_FDCWD, str(directory).encode()) != 0:
            os.close(fd)
            return None
        watch = cls(directory, fd)
        watch._thread = threading.Thread(target=watch._loop, name="polar-fs-writers", daemon=True)
        watch._thread.start()
        return watch

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            stopping = self._stop.is_set()
            if poller.poll(50):
                self._read()
            elif stopping:
                return  # the stop was seen with nothing left to read

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        offset = 0
        while offset + METADATA.size <= len(data):
            length, _, _, meta_len, mask, event_fd, pid = METADATA.unpack_from(data, offset)
            if event_fd >= 0:
                os.close(event_fd)
            self.events.append((pid, _name(data[offset + meta_len : offset + length])))
            offset += length

    def stop(self) -> list[tuple[int, str]]:
        """End the watch once every queued event is read; the (pid, name) of each event, in order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        os.close(self.fd)
        return list(self.events)


def _name(info: bytes) -> str:
    """The entry name of an event's DFID_NAME record ("" for the directory itself)."""
    offset = 0
    while offset + INFO_HEADER.size <= len(info):
        kind, _, length = INFO_HEADER.unpack_from(info, offset)
        if kind == FAN_EVENT_INFO_TYPE_DFID_NAME and length:
            record = info[offset + INFO_HEADER.size : offset + length]
            handle_bytes = struct.unpack_from("=I", record, 8)[0]  # after the 8-byte fsid
            name = record[8 + 8 + handle_bytes :].split(b"\0", 1)[
                0
            ]  # after handle_bytes, handle_type, the handle
            return "" if name == b"." else name.decode("utf-8", "surrogateescape")
        offset += max(length, INFO_HEADER.size)
    return ""
