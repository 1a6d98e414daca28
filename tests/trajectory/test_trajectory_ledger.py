"""The ledger is a write-ahead log: what append() returned for survives SIGKILL; torn tails are reported."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from pathlib import Path

import pytest
from repo_paths import TESTS
from trajectory_helpers import call, long_chain, reusing, session, three_turn

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.ledger import Ledger, LedgerError, encode_line
from polar_env.trajectory.records import CallRecord, ids_digest

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from trajectory_helpers import call, session
    from polar_env.trajectory.ledger import Ledger

    ledger = Ledger(Path({root!r}), fsync={fsync})
    ledger.create_session(session("killme"))
    prompt = list(range(5000))
    i = 0
    while True:
        ledger.append(call(i, prompt, [i, i + 1, i + 2], parent=i - 1 if i else None, session_id="killme"))
        print(i, flush=True)
        prompt = prompt + [i, i + 1, i + 2, 7]
        i += 1
""")


@pytest.mark.parametrize("fsync", [False, True])
def test_sigkill_mid_session_loses_no_answered_call(tmp_path: Path, fsync: bool):
    script = CHILD.format(tests=str(TESTS), root=str(tmp_path), fsync=fsync)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acknowledged = []
    try:
        for line in child.stdout:
            acknowledged.append(int(line))
            if len(acknowledged) >= 40:
                break
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        # the child may have answered more before the kill landed
        acknowledged += [int(x) for x in child.stdout.read().split()]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    ledger = Ledger(tmp_path)
    report = ledger.recover()
    assert not report.all_errors
    calls = ledger.calls("killme")
    indices = [c.call_index for c in calls]
    assert indices == list(range(len(indices)))  # in order, no hole
    assert set(acknowledged) <= set(indices)  # every answered call survived
    assert report.total_calls == len(calls)
    # and the survivors still form one token-exact chain
    traj = build_trajectory(ledger.session("killme"), calls)
    assert len(traj.chains) == 1 and traj.stats.trainable_tokens == 3 * len(calls)


def test_round_trip_and_session_api(tmp_path: Path):
    ledger = Ledger(tmp_path)
    info = session("s1")
    ledger.create_session(info)
    with pytest.raises(ValueError, match="already exists"):
        ledger.create_session(info)
    for record in three_turn():
        ledger.append(record)
    # back as written, plus the hash of each whole prompt (the ledger computes what the writer left out)
    assert [c.model_dump() for c in ledger.calls("s1")] == [
        c.model_copy(update={"prompt_sha256": ids_digest(c.prompt_ids).hexdigest()}).model_dump()
        for c in three_turn()
    ]
    ledger.update_session(info.model_copy(update={"status": "completed", "closed_at": 2000.0}))
    ledger.close_session("s1")
    reopened = Ledger(tmp_path)
    assert reopened.session("s1").status == "completed"
    assert [s.session_id for s in reopened.sessions()] == ["s1"]
    assert reopened.session("nope") is None
    assert reopened.recover().ok
    with pytest.raises(LedgerError):
        reopened.append(call(0, [1], [2], session_id="unknown"))


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "-x", "x" * 129, "a\nb", "..", "a b"])
def test_session_ids_are_validated(tmp_path: Path, bad: str):
    ledger = Ledger(tmp_path)
    with pytest.raises(ValueError, match="invalid session id"):
        ledger.create_session(session(bad) if bad else session("x").model_copy(update={"session_id": bad}))
    with pytest.raises(ValueError):
        ledger.session(bad)
    assert not (tmp_path.parent / "escape").exists()


def _ledger_with_calls(tmp_path: Path) -> tuple[Ledger, Path]:
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    for record in three_turn():
        ledger.append(record)
    ledger.close()
    return ledger, tmp_path / "sessions" / "s1" / "calls.jsonl"


def test_torn_last_line_is_reported_and_moved_aside(tmp_path: Path):
    # Test double for a crash mid-write: SIGKILL rarely tears a single write(), so write half a line.
    ledger, path = _ledger_with_calls(tmp_path)
    good_size = path.stat().st_size
    extra = call(3, [1], [2]).model_dump_json().encode()
    with open(path, "ab") as handle:
        handle.write(extra[: len(extra) // 2])
    assert len(ledger.calls("s1")) == 3  # an unterminated tail is not a finished record
    report = Ledger(tmp_path).recover()
    assert not report.ok
    [torn] = report.torn
    assert (torn.session_id, torn.offset, torn.length) == ("s1", good_size, len(extra) // 2)
    assert Path(torn.saved_to).read_bytes() == extra[: len(extra) // 2]
    assert path.stat().st_size == good_size
    assert Ledger(tmp_path).recover().ok  # nothing left to repair
    assert [c.call_index for c in Ledger(tmp_path).calls("s1")] == [0, 1, 2]


def test_garbage_terminated_last_line_is_torn_too(tmp_path: Path):
    ledger, path = _ledger_with_calls(tmp_path)
    with open(path, "ab") as handle:
        handle.write(b"\0\0\0\0\n")  # a zero-filled block after a power cut
    with pytest.raises(LedgerError, match="corrupt record at byte"):
        ledger.calls("s1")
    report = Ledger(tmp_path).recover()
    assert len(report.torn) == 1 and not report.all_errors
    assert len(Ledger(tmp_path).calls("s1")) == 3


def test_append_after_crash_never_glues_onto_a_torn_tail(tmp_path: Path):
    ledger, path = _ledger_with_calls(tmp_path)
    with open(path, "ab") as handle:
        handle.write(b'{"schema_version": 1, "sess')
    fresh = Ledger(tmp_path)  # a restarted proxy that appends before (or without) recover()
    fresh.append(call(3, [1], [2]))
    assert [c.call_index for c in fresh.calls("s1")] == [0, 1, 2, 3]
    assert list(path.parent.glob("calls.jsonl.torn-*"))


def test_corrupt_middle_line_is_an_error_not_silently_dropped(tmp_path: Path):
    ledger, path = _ledger_with_calls(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:40] + b"#" + lines[1][41:]
    path.write_bytes(b"\n".join(lines))
    report = Ledger(tmp_path).recover()
    assert any("corrupt record at byte" in e and "not the last line" in e for e in report.all_errors)
    assert report.torn == []
    # call 2 stores only what it adds to call 1: without call 1 it cannot be rebuilt, so it goes too
    assert [c.call_index for c in Ledger(tmp_path).calls("s1")] == [0]
    assert (path.parent / "calls.jsonl.corrupt").read_bytes().count(b"\n") == 4


def test_append_is_visible_to_another_reader_immediately(tmp_path: Path):
    writer = Ledger(tmp_path)
    writer.create_session(session("s1"))
    record = three_turn()[0]
    writer.append(record)
    # a second process would see it: read through a fresh file descriptor, no close/flush by us
    reader = Ledger(tmp_path)
    assert reader.calls("s1")[0].call_id == record.call_id
    size = os.stat(tmp_path / "sessions" / "s1" / "calls.jsonl").st_size
    assert size == len(encode_line(record))


def test_a_line_holds_what_the_call_adds_and_reads_back_whole(tmp_path: Path):
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    records = long_chain(60)
    for record in records:
        ledger.append(record)
    path = tmp_path / "sessions" / "s1" / "calls.jsonl"
    sizes = [len(line) for line in path.read_bytes().splitlines()]
    assert max(sizes[1:]) < 1.2 * min(sizes[1:])  # call 59 (3,900 prompt ids) costs what call 1 (370) does
    back = ledger.calls("s1")
    assert [(c.prompt_ids, c.messages, c.tools) for c in back] == [
        (c.prompt_ids, c.messages, c.tools) for c in records
    ]
    assert all(c.prompt_sha256 == ids_digest(c.prompt_ids).hexdigest() for c in back)
    traj = build_trajectory(ledger.session("s1"), back)
    assert len(traj.chains) == 1 and traj.chains[0].input_ids == back[-1].prompt_ids + back[-1].sampled_ids
    assert path.stat().st_size / len(traj.chains[0].input_ids) < 40  # bytes per distinct token, flat


def test_read_back_prompts_share_their_chain_yet_stay_exact(tmp_path: Path):
    """A chain's prompts are read back as prefixes of one list (not a list per call: calls x context
    ids); a retry branching off the middle, and its own child, still read back token-exact."""
    records = long_chain(120, appended=200)
    parent = records[60]
    retry = reusing(
        call(
            120,
            parent.prompt_ids + parent.sampled_ids + [9, 9],
            [7, 8],
            parent=60,
            tool="shell",
            messages=records[61].messages,
        ),
        parent,
    )
    child = reusing(
        call(
            121,
            retry.prompt_ids + retry.sampled_ids + [6],
            [5],
            parent=120,
            tool="shell",
            messages=records[61].messages,
        ),
        retry,
    )
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    for record in [*records, retry, child]:
        ledger.append(record)
    tracemalloc.start()
    back = ledger.calls("s1")
    allocated = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    distinct = len(records[-1].prompt_ids) + len(records[-1].sampled_ids)
    as_lists = sum(8 * len(r.prompt_ids) for r in records)  # the pointer arrays of one list per prompt
    assert allocated < as_lists / 2, (allocated, as_lists, distinct)
    written = [*records, retry, child]
    assert [(c.prompt_ids, c.sampled_ids, c.messages) for c in back] == [
        (c.prompt_ids, c.sampled_ids, c.messages) for c in written
    ]  # each prompt equals the list it stands for
    assert [json.loads(r.model_dump_json())["prompt_ids"] for r in back] == [r.prompt_ids for r in written]
    assert back[60].prompt_ids[-1] == parent.prompt_ids[-1] and len(back[60].prompt_ids) == len(
        parent.prompt_ids
    )
    assert (
        back[121].prompt_ids[-3:] == [9, 9, 7, 8, 6][-3:] and list(back[121].prompt_ids) == child.prompt_ids
    )
    traj = build_trajectory(ledger.session("s1"), back)
    assert [len(ch.call_indices) for ch in traj.chains] == [
        120,
        2,
    ]  # the retry is a branch: a chain of its own
    assert traj.chains[1].input_ids == child.prompt_ids + child.sampled_ids


def test_an_altered_record_is_caught_by_its_childrens_prompt_hash(tmp_path: Path):
    ledger, path = _ledger_with_calls(tmp_path)
    lines = path.read_bytes().split(b"\n")
    assert b'"sampled_ids":[10,11,12]' in lines[0]
    lines[0] = lines[0].replace(b'"sampled_ids":[10,11,12]', b'"sampled_ids":[10,99,12]')  # still valid JSON
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerError, match="call 1: the prompt rebuilt from its parent chain .* SHA-256"):
        Ledger(tmp_path).calls("s1")
    report = Ledger(tmp_path).recover()
    assert sum("does not rebuild from its parent chain" in e for e in report.all_errors) == 2


def test_an_old_format_ledger_is_read_and_extended_in_place(tmp_path: Path):
    old = three_turn()[:2]
    folder = tmp_path / "sessions" / "s1"
    folder.mkdir(parents=True)
    (folder / "session.json").write_text(session("s1").model_dump_json())
    new_fields = {"prompt_sha256", "reused_messages", "reused_tools"}  # what format-1 lines lack
    (folder / "calls.jsonl").write_bytes(
        b"".join(
            c.model_copy(update={"schema_version": 1}).model_dump_json(exclude=new_fields).encode() + b"\n"
            for c in old
        )
    )
    ledger = Ledger(tmp_path)
    assert ledger.recover().ok
    ledger.append(three_turn()[2])  # a proxy restarted on an old data dir goes on in format 2
    back = ledger.calls("s1")
    assert [c.schema_version for c in back] == [1, 1, 2]
    assert [c.prompt_ids for c in back] == [c.prompt_ids for c in three_turn()]
    assert len(build_trajectory(ledger.session("s1"), back).chains) == 1


def test_a_newer_format_says_so(tmp_path: Path):
    ledger, path = _ledger_with_calls(tmp_path)
    with open(path, "ab") as handle:
        handle.write(b'{"schema_version": 9, "session_id": "s1"}\n')
    with pytest.raises(LedgerError, match="written in ledger format 9; this polar_env reads formats 1-2"):
        ledger.calls("s1")


async def test_append_async_writes_on_the_ledger_thread_and_returns_once_written(tmp_path: Path):
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    writers: list[str] = []
    write = ledger.append

    def observed(record: CallRecord) -> None:  # the real append, noting which thread runs it
        writers.append(threading.current_thread().name)
        write(record)

    ledger.append = observed
    for record in three_turn():
        await ledger.append_async(record)
        # the await returned: the line is already there for another reader (a restarted proxy)
        assert Ledger(tmp_path).calls("s1")[-1].call_id == record.call_id
    assert len(writers) == 3 and all(name.startswith("polar-ledger") for name in writers)
    assert threading.current_thread().name not in writers


async def test_a_small_append_is_written_on_the_loop_unless_the_writer_has_lines_queued(tmp_path: Path):
    """A turn-sized line skips the hop to the writer thread, but never overtakes a queued line
    (the queued write is held by a test double: a slow disk cannot be provoked here), and never
    with fsync (a disk wait would stall the loop)."""
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    first, second, third = three_turn()
    release = threading.Event()
    write = ledger.append
    writers: list[tuple[str, str]] = []

    def observed(record: CallRecord) -> None:
        writers.append((record.call_id, threading.current_thread().name))
        if record is first:
            release.wait(10)
        write(record)

    ledger.append = observed
    queued = asyncio.create_task(ledger.append_async(first))  # a large line: the writer thread
    await asyncio.sleep(0.05)
    behind = asyncio.create_task(ledger.append_async(second, small=True))  # the writer is busy: queued too
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(queued, behind)
    await ledger.append_async(third, small=True)  # nothing queued now: on the loop
    assert Ledger(tmp_path).calls("s1")[-1].call_id == third.call_id  # on disk when the await returns
    here = threading.current_thread().name
    assert [(c, n == here) for c, n in writers] == [
        (first.call_id, False),
        (second.call_id, False),
        (third.call_id, True),
    ]
    assert [c.call_id for c in Ledger(tmp_path).calls("s1")] == [first.call_id, second.call_id, third.call_id]
    ledger.close()
    synced = Ledger(tmp_path / "fsync", fsync=True)
    synced.create_session(session("s1"))
    synced.append = observed
    await synced.append_async(first, small=True)
    assert writers[-1][1] != here
    synced.close()


async def test_a_cancelled_append_still_writes_its_line_before_the_cancel_returns(tmp_path: Path):
    """A call cancelled while its line waits behind another session's write (drain cancels calls
    after its timeout) must not lose the line: the record already counts as written. The slow
    first write is a test double: a blocked disk cannot be provoked here."""
    ledger = Ledger(tmp_path)
    ledger.create_session(session("s1"))
    first, second = three_turn()[:2]
    release = threading.Event()
    write = ledger.append

    writers: set[threading.Thread] = set()

    def slow(record: CallRecord) -> None:
        writers.add(threading.current_thread())
        if record is first:
            release.wait(10)
        write(record)

    ledger.append = slow
    blocking = asyncio.create_task(ledger.append_async(first))
    queued = asyncio.create_task(ledger.append_async(second))
    await asyncio.sleep(0.05)
    queued.cancel()
    asyncio.get_running_loop().call_later(0.2, release.set)
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert [c.call_id for c in Ledger(tmp_path).calls("s1")] == [first.call_id, second.call_id]
    await blocking
    ledger.close()  # and its writer thread ends with it
    assert writers and not any(thread.is_alive() for thread in writers)
