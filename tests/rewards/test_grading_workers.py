"""Grading in worker processes (rewards/workers.py) and the gold runs they share once per node
(rewards/gold_runs.py): real spawned processes and a real file lock; the last test grades the
bundled task's gold patch for real in a worker."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from polar_env.rewards import gold_runs
from polar_env.rewards.grader import grade_task
from polar_env.rewards.grading import TestRun as GoldRun  # (not a test class)
from polar_env.rewards.workers import GraderCrashed, GradingWorkers
from polar_env.tasks.base_trees import base_key
from polar_env.tasks.loader import load_tasks

KEY = "polar-test-gold"


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does to a worker


async def test_grades_run_in_other_processes_and_a_dead_worker_fails_only_its_grade():
    workers = GradingWorkers(1)
    try:
        first = await workers.run(os.getpid)
        assert first != os.getpid()
        assert await workers.run(os.getpid) == first  # the worker stays for the next grade
        with pytest.raises(GraderCrashed, match="the grading worker died"):
            await workers.run(_killed)
        again = await workers.run(os.getpid)  # a fresh pool for the next grade
        assert again not in (first, os.getpid())
    finally:
        workers.close()


async def test_threads_grade_in_this_process():
    workers = GradingWorkers(1, processes=False)
    try:
        assert await workers.run(os.getpid) == os.getpid()
    finally:
        workers.close()


def _slow_gold(log: Path, valid: bool) -> GoldRun:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)  # long enough for the other worker to reach the lock meanwhile
    return GoldRun(
        valid=valid, collected=["tests/test_x.py::test_a"], status_map={"tests/test_x.py::test_a": "PASSED"}
    )


def _gold_in_worker(log: Path, valid: bool = True) -> GoldRun:
    return gold_runs.gold_run(KEY, GoldRun, lambda: _slow_gold(log, valid), keep=lambda run: run.valid)


async def test_a_gold_run_is_run_once_per_node_by_concurrent_workers(tmp_path: Path, monkeypatch):
    """Two worker processes ask for the same gold run at once: one runs it, the other waits on the key's
    lock and reads the entry; a later process (a later `polar` command) reads it too."""
    monkeypatch.setenv(
        "POLAR_GOLD_CACHE", str(tmp_path / "gold")
    )  # before the workers spawn: they inherit it
    log = tmp_path / "ran"
    a, b = GradingWorkers(1), GradingWorkers(1)
    try:
        runs = await asyncio.gather(a.run(_gold_in_worker, log), b.run(_gold_in_worker, log))
    finally:
        a.close()
        b.close()
    assert len(log.read_text().split()) == 1, log.read_text()
    assert runs[0] == runs[1] and runs[0].collected == ["tests/test_x.py::test_a"]
    assert stat.S_IMODE((tmp_path / "gold").stat().st_mode) == 0o700  # the grader's own
    assert gold_runs.cached(KEY, GoldRun) == runs[0]
    assert _gold_in_worker(log) == runs[0] and len(log.read_text().split()) == 1


def test_a_run_not_kept_or_an_unreadable_entry_is_run_again(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("POLAR_GOLD_CACHE", str(tmp_path / "gold"))
    log = tmp_path / "ran"
    assert not _gold_in_worker(log, valid=False).valid  # a sandbox hiccup: returned, not stored
    assert gold_runs.cached(KEY, GoldRun) is None
    (tmp_path / "gold" / f"{KEY}.json").write_text('{"valid": tr')  # half-written, or bent
    assert gold_runs.cached(KEY, GoldRun) is None
    assert _gold_in_worker(log).valid
    assert len(log.read_text().split()) == 2


def test_the_key_names_the_task_where_it_ran_and_the_grader():
    task = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
    key = gold_runs.gold_key(task, "tree:x")
    assert key.startswith("pallets__flask-5014-") and key == gold_runs.gold_key(task, "tree:x")
    assert gold_runs.gold_key(task, "image:y") != key
    assert gold_runs.gold_key(task.model_copy(update={"test_patch": task.test_patch + "\n"}), "tree:x") != key
    gold_runs.grader_digest.cache_clear()
    try:
        real = gold_runs.grader_digest()
        gold_runs.grader_digest.cache_clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gold_runs, "grader_digest", lambda: real[::-1])  # a changed grader
            assert gold_runs.gold_key(task, "tree:x") != key
    finally:
        gold_runs.grader_digest.cache_clear()


@pytest.mark.slow
@pytest.mark.needs("bwrap")
async def test_a_real_grade_in_a_worker_keeps_its_gold_run_for_the_node(tmp_path: Path, monkeypatch):
    """The bundled task's gold patch graded in a worker process (the real grader, bubblewrap): resolved,
    and its gold run is on disk for every later grade of the task on this node."""
    monkeypatch.setenv("POLAR_GOLD_CACHE", str(tmp_path / "gold"))
    task = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
    workers = GradingWorkers(1)
    try:
        result = await workers.run(grade_task, task, task.patch, kind="bubblewrap")
    finally:
        workers.close()
    assert result.resolved and result.reward == 1.0, (result.failure_kind, result.error)
    gold = gold_runs.cached(gold_runs.gold_key(task, f"tree:{base_key(task)}"), GoldRun)
    assert gold is not None and gold.valid and set(task.FAIL_TO_PASS) <= set(gold.collected)
