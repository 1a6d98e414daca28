"""`cache.write_atomic`, the one way a cache entry is written: threads and processes writing the same entry
at once (two samples of a task opening their workspaces, each caching the same answer scan) never fail
and never leave a part. Each writer has a temp file of its own: a name made from the pid alone was shared
by the threads of one process, and one thread's rename took the file another was about to rename."""

from __future__ import annotations

import threading
from pathlib import Path

from polar_env.cache import write_atomic


def test_threads_writing_one_entry_at_once_never_fail_nor_leave_a_part(tmp_path: Path):
    entry = tmp_path / "scans" / "entry.json"
    payloads = [bytes([65 + n]) * (1 << 16) for n in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(payloads))

    def write(data: bytes) -> None:
        start.wait()
        try:
            for _ in range(50):
                write_atomic(entry, data)
                assert entry.read_bytes() in payloads  # whole, whichever writer won
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(data,)) for data in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [], errors[:3]
    assert entry.read_bytes() in payloads and entry.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in entry.parent.iterdir()] == ["entry.json"]  # no temp file left behind
